"""Per-job fault isolation (issue 52, item 1; ARCHITECTURE invariants 9 and 12): whatever goes
wrong while the tick handles one job is recorded on that job (a tick_error event, the answer's
job_errors) and the tick goes on with the others, answering 200; a job whose handling fails
the same way on SFTQ_JOB_FAULT_LIMIT ticks in a row ends FAIL permanent, so it cannot hold
its owner's slot, nor the queue, forever."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from sched_support import (
    ACCOUNT,
    TICK_SECRET,
    RecordingSimulator,
    create_user,
    enqueue,
    events,
    job,
    payload,
    state,
)
from werkzeug.test import Client

from sftq_server.core.settings import Settings
from sftq_server.db import Database
from sftq_server.http.gateway import make_gateway
from sftq_server.provider import FireworksClient, ProviderJob
from sftq_server.scheduler.http import make_tick_app

BAD_DATASET = f"accounts/{ACCOUNT}/datasets/foo\n"  # the trailing newline of the issue


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def _with(settings: Settings, **changes: Any) -> Settings:
    return Settings(**{**settings.__dict__, **changes})


class TickHttp:
    """POST /functions/v1/scheduler-tick through the real WSGI app: what pg_cron sees."""

    def __init__(self, settings: Settings, database: Database,
                 provider: FireworksClient) -> None:
        self.client = Client(make_tick_app(settings, db=database,
                                           provider_factory=lambda: provider))

    def __call__(self) -> dict[str, Any]:
        resp = self.client.post("/", headers={"Authorization": f"Bearer {TICK_SECRET}"})
        assert resp.status_code == 200, resp.get_data(as_text=True)
        answer: dict[str, Any] = json.loads(resp.get_data(as_text=True))
        return answer


def tick_errors(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> list[dict[str, Any]]:
    return [e for e in events(conn, job_id) if e["event"] == "tick_error"]


def fault_row(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> Any:
    return conn.execute("SELECT faults, phase, error_type FROM sftq.job_faults WHERE job_id = %s",
                        (job_id,)).fetchone()


def recorded(conn: psycopg.Connection[Any], tick_id: int) -> dict[str, Any]:
    row = conn.execute("SELECT status, detail FROM sftq.scheduler_ticks WHERE id = %s",
                       (tick_id,)).fetchone()
    assert row is not None
    return {"status": row[0], **row[1]}


# --- the reproduction --------------------------------------------------------------

def _bad_job_via_api(conn: psycopg.Connection[Any], settings: Settings, database: Database,
                     user: str) -> uuid.UUID:
    """POST /jobs with the trailing-newline dataset and "validate": "off", as the issue did."""
    key = str(conn.execute("SELECT key FROM sftq.issue_key(%s)", (user,)).fetchone()[0])
    gateway = Client(make_gateway(_with(settings, preflight=True)))
    body = {"kind": "SFT", "validate": "off", "gpu_count": 4,
            "fireworks_payload": {**payload("SFT"), "dataset": BAD_DATASET}}
    resp = gateway.post("/functions/v1/jobs-api/jobs", json=body,
                        headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    assert resp.json is not None
    return uuid.UUID(resp.json["id"])


@pytest.mark.parametrize("how", ["waiting_for_the_tick_preflight", "validate_off"])
def test_a_dataset_name_with_a_trailing_newline_stops_nobody(
        how: str, conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, sim: RecordingSimulator) -> None:
    settings = _with(settings, preflight=True, job_fault_limit=3)
    alice = create_user(conn, "alice")
    bob = create_user(conn, "bob")
    carol = create_user(conn, "carol")
    # Alice's first job holds her slot, so her bad job waits in the queue, where only the
    # pre-flight handles it, tick after tick.
    busy = enqueue(conn, alice, "SFT", gpus=4)
    older = enqueue(conn, bob, "SFT", gpus=4)
    if how == "validate_off":
        bad = _bad_job_via_api(conn, settings, database, "alice")
    else:
        # Enqueued while the provider could not be asked in time: the tick's pre-flight
        # asks, and today's provider client meets the name as httpx.InvalidURL.
        bad = enqueue(conn, alice, "SFT", gpus=4,
                      body={**payload("SFT"), "dataset": BAD_DATASET})
    newer = enqueue(conn, carol, "SFT", gpus=4)
    tick = TickHttp(settings, database, provider)

    answers = [tick()]  # before issue 52: a 500 here, and on every tick after it
    # Other users' older and newer jobs are admitted on that same tick.
    assert set(answers[0]["admitted"]) == {str(busy), str(older), str(newer)}
    answers += [tick(), tick()]
    for answer in answers:
        # Nobody else faulted, and what the answer lists is what the tick row keeps.
        assert all(e["job_id"] == str(bad) for e in answer["job_errors"])
        assert recorded(conn, answer["tick_id"])["job_errors"] == answer["job_errors"]
    assert states_of(conn, [busy, older, newer]) == {"PROGRESS"}
    if how == "validate_off":
        # jobs-api recorded its pre-flight as skipped: the tick never looks the name up,
        # so nothing faults; the job waits for its owner's slot like any other (Fireworks
        # itself answers its create, which the submit phase handles).
        assert state(conn, bad) == "QUEUED" and tick_errors(conn, bad) == []
        return
    seen = tick_errors(conn, bad)
    if not seen:
        # The provider client matches names whole (issue 52): it never builds a URL of this
        # one, so the pre-flight has nothing to look up and nothing faults; the job waits for
        # its owner's slot like any other (Fireworks answers its create, and the submit phase
        # handles that). The fault path itself: the test below, and the injected faults.
        assert job(conn, bad)["state"] in ("QUEUED", "FAIL"), job(conn, bad)
        assert all(a["job_errors"] == [] for a in answers), answers
        return
    # One error event a tick, each listed in that tick's answer; the third ends the job.
    assert [e["detail"]["tick_id"] for e in seen] == [a["tick_id"] for a in answers]
    assert [[(e["phase"], e["ended"]) for e in a["job_errors"]] for a in answers] == [
        [("preflight", False)], [("preflight", False)], [("preflight", True)]]
    row = job(conn, bad)
    assert row["state"] == "FAIL" and row["failure_class"] == "permanent", row
    assert "3 ticks in a row" in row["error"], row["error"]
    assert sim.created_ok()[_pid(bad)] == 0  # never sent to the provider


def states_of(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> set[str]:
    return {state(conn, i) for i in ids}


class InvalidUrlOn:
    """The provider client as the issue met it: a lookup of one name raises httpx.InvalidURL,
    which is no ProviderError."""

    def __init__(self, inner: FireworksClient, name: str) -> None:
        self._inner = inner
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    def get_resource(self, name: str, **kw: Any) -> dict[str, Any]:
        if name == self.name:
            raise httpx.InvalidURL(f"Invalid non-printable ASCII character in URL: {name!r}")
        return self._inner.get_resource(name, **kw)


def test_the_tick_preflight_fault_is_recorded_then_ends_the_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient) -> None:
    """The issue's job, as the provider client of the issue met it (httpx.InvalidURL in the
    tick's pre-flight): an event per tick, then FAIL permanent at the limit, through PROGRESS."""
    settings = _with(settings, preflight=True, job_fault_limit=3)
    alice = create_user(conn, "alice")
    # Held in the queue by its owner's running job, so only the pre-flight handles it.
    busy = enqueue(conn, alice, "SFT", gpus=4)
    exploding = f"accounts/{ACCOUNT}/datasets/explodes"
    bad = enqueue(conn, alice, "SFT", gpus=4, body={**payload("SFT"), "dataset": exploding})
    tick = TickHttp(settings, database, InvalidUrlOn(provider, exploding))  # type: ignore[arg-type]
    tick()
    assert state(conn, busy) == "PROGRESS" and state(conn, bad) == "QUEUED"
    for n in (1, 2):
        errors = tick_errors(conn, bad)
        assert len(errors) == n, errors
        assert errors[-1]["detail"]["phase"] == "preflight"
        assert errors[-1]["detail"]["fault"] == n and errors[-1]["detail"]["limit"] == 3
        assert state(conn, bad) == "QUEUED"
        assert fault_row(conn, bad)[0] == n
        answer = tick()
    assert answer["job_errors"] == [{"job_id": str(bad), "phase": "preflight",
                                     "error": answer["job_errors"][0]["error"], "ended": True}]
    row = job(conn, bad)
    assert row["state"] == "FAIL" and row["failure_class"] == "permanent"
    assert "3 ticks in a row" in row["error"] and "preflight" in row["error"]
    moves = [(e["event"], e["from_state"], e["to_state"]) for e in events(conn, bad)][-2:]
    assert moves == [("tick_error", "QUEUED", "PROGRESS"), ("failed", "PROGRESS", "FAIL")]
    assert fault_row(conn, bad) is None
    assert answer["failed"] >= 1
    assert state(conn, busy) == "PROGRESS"


# --- an arbitrary exception, in every phase ------------------------------------------------

class Faulty:
    """The provider client, except that every call about one job raises RuntimeError."""

    def __init__(self, inner: FireworksClient, bad: set[str]) -> None:
        self._inner = inner
        self.bad = bad
        self.raised: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _check(self, call: str, ref: str) -> None:
        if any(b in ref for b in self.bad):
            self.raised.append((call, ref))
            raise RuntimeError(f"injected fault in {call} for {ref}")

    def get_job(self, kind: str, job_id: str) -> ProviderJob:
        self._check("get_job", job_id)
        return self._inner.get_job(kind, job_id)

    def create_job(self, kind: str, job_id: str, body: dict[str, Any], **kw: Any) -> ProviderJob:
        self._check("create_job", job_id)
        return self._inner.create_job(kind, job_id, body, **kw)

    def stop_job(self, kind: str, job_id: str) -> str:
        self._check("stop_job", job_id)
        return self._inner.stop_job(kind, job_id)

    def get_resource(self, name: str, **kw: Any) -> dict[str, Any]:
        self._check("get_resource", name)
        return self._inner.get_resource(name, **kw)


def _pid(job_id: uuid.UUID) -> str:
    return "sftq-" + job_id.hex


def _users(conn: psycopg.Connection[Any], n: int) -> list[int]:
    return [create_user(conn, f"user{i}") for i in range(n)]


def _run(settings: Settings, database: Database, faulty: Faulty) -> dict[str, Any]:
    from sftq_server.scheduler.tick import run_tick

    return run_tick(database, faulty, settings, holder="test")  # type: ignore[arg-type]


def _admit_and_submit(conn: psycopg.Connection[Any], settings: Settings, database: Database,
                      provider: FireworksClient, users: list[int]) -> list[uuid.UUID]:
    ids = [enqueue(conn, u, "SFT", gpus=4) for u in users]
    answer = _run(settings, database, Faulty(provider, set()))
    assert answer["submitted"] == len(ids), answer
    return ids


def test_a_fault_in_reconcile_touches_only_that_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, sim: RecordingSimulator) -> None:
    ids = _admit_and_submit(conn, settings, database, provider, _users(conn, 3))
    bad, others = ids[1], [ids[0], ids[2]]
    for other in others:
        sim.finish("SFT", _pid(other), "JOB_STATE_COMPLETED")
    faulty = Faulty(provider, {_pid(bad)})
    answer = _run(settings, database, faulty)
    assert ("get_job", _pid(bad)) in faulty.raised
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [(str(bad), "reconcile")]
    assert "RuntimeError: injected fault" in answer["job_errors"][0]["error"]
    assert all(state(conn, o) == "SUCCESS" for o in others)
    assert state(conn, bad) == "PROGRESS"
    assert [e["detail"]["phase"] for e in tick_errors(conn, bad)] == ["reconcile"]


def test_a_listing_fault_falls_back_to_gets(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, sim: RecordingSimulator) -> None:
    # More than LIST_THRESHOLD of one kind: reconcile lists, and the listing raises.
    ids = _admit_and_submit(conn, settings, database, provider, _users(conn, 5))
    for i in ids:
        sim.finish("SFT", _pid(i), "JOB_STATE_COMPLETED")
    faulty = Faulty(provider, set())

    def broken_list(kind: str, **kw: Any) -> Any:
        raise KeyError("an item nobody expected")

    faulty.list_jobs = broken_list  # type: ignore[attr-defined]
    answer = _run(settings, database, faulty)
    assert any("list: KeyError" in e for e in answer["errors"]), answer["errors"]
    assert answer["job_errors"] == []
    assert all(state(conn, i) == "SUCCESS" for i in ids)


def test_a_fault_in_a_cancel_touches_only_that_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient) -> None:
    users = _users(conn, 3)
    ids = _admit_and_submit(conn, settings, database, provider, users)
    for u, i in zip(users, ids, strict=True):
        conn.execute("SELECT sftq.cancel(%s, %s)", (u, i))
    bad = ids[0]
    answer = _run(settings, database, Faulty(provider, {_pid(bad)}))
    # Its reconcile (a GET) and its stop both raise: two errors, one fault counted.
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [
        (str(bad), "reconcile"), (str(bad), "cancel")]
    assert fault_row(conn, bad)[0] == 1
    assert state(conn, ids[1]) == "CANCELLED" and state(conn, ids[2]) == "CANCELLED"
    # The cancel stays recorded: the next tick without the fault finishes it.
    assert state(conn, bad) == "PROGRESS"
    _run(settings, database, Faulty(provider, set()))
    assert state(conn, bad) == "CANCELLED"


def test_faults_in_two_phases_a_tick_still_reach_the_limit(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient) -> None:
    settings = _with(settings, job_fault_limit=2)
    users = _users(conn, 1)
    [bad] = _admit_and_submit(conn, settings, database, provider, users)
    conn.execute("SELECT sftq.cancel(%s, %s)", (users[0], bad))

    class TwoWays(Faulty):
        def get_job(self, kind: str, job_id: str) -> ProviderJob:
            raise KeyError("reconcile's own way")

    faulty = TwoWays(provider, {_pid(bad)})
    _run(settings, database, faulty)
    assert fault_row(conn, bad) == (1, "reconcile", "KeyError")
    answer = _run(settings, database, faulty)
    assert answer["job_errors"][0]["ended"] is True
    assert state(conn, bad) == "FAIL"


def test_a_fault_in_a_create_touches_only_that_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, sim: RecordingSimulator) -> None:
    users = _users(conn, 3)
    ids = [enqueue(conn, u, "SFT", gpus=4) for u in users]
    bad = ids[1]
    answer = _run(settings, database, Faulty(provider, {_pid(bad)}))
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [(str(bad), "submit")]
    assert set(answer["admitted"]) == {str(i) for i in ids}
    assert answer["submitted"] == 2
    assert set(sim.created_ok()) == {_pid(ids[0]), _pid(ids[2])}
    # Admitted, not created: the next tick's retry sends it once the fault is gone, and
    # that success ends its run of faults.
    assert state(conn, bad) == "PROGRESS" and job(conn, bad)["submitted_at"] is None
    assert fault_row(conn, bad)[0] == 1
    _run(settings, database, Faulty(provider, set()))
    assert job(conn, bad)["submitted_at"] is not None
    assert fault_row(conn, bad) is None


def test_a_fault_in_the_preflight_touches_only_that_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient) -> None:
    settings = _with(settings, preflight=True)
    users = _users(conn, 3)
    bad_name = f"accounts/{ACCOUNT}/datasets/poison"
    ids = [enqueue(conn, u, "SFT", gpus=4,
                   body={**payload("SFT"), "dataset": bad_name} if n == 1 else None)
           for n, u in enumerate(users)]
    bad = ids[1]
    answer = _run(settings, database, Faulty(provider, {bad_name}))
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [(str(bad), "preflight")]
    assert {str(ids[0]), str(ids[2])} <= set(answer["admitted"])


def test_a_fault_in_the_last_check_touches_only_that_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient) -> None:
    users = _users(conn, 3)
    ids = [enqueue(conn, u, "SFT", gpus=4) for u in users]
    _run(settings, database, Faulty(provider, {_pid(i) for i in ids}))
    # Admitted, creates failed by faults: out of attempts now, so the next tick makes the
    # last check (a GET) for each, and the one for `bad` raises.
    conn.execute("UPDATE sftq.jobs SET submit_attempts = 8 WHERE id = ANY(%s)", (ids,))
    bad = ids[2]
    answer = _run(settings, database, Faulty(provider, {_pid(bad)}))
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [(str(bad), "last_check")]
    assert state(conn, ids[0]) == "FAIL" and state(conn, ids[1]) == "FAIL"  # gave up: 404
    assert state(conn, bad) == "PROGRESS"


# --- the count: the same way, ticks in a row; a success resets it --------------------------

def test_the_limit_ends_a_submitted_job_and_stops_its_provider_job(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, sim: RecordingSimulator) -> None:
    settings = _with(settings, job_fault_limit=2)
    ids = _admit_and_submit(conn, settings, database, provider, _users(conn, 2))
    bad = ids[0]

    class ReconcileFault(Faulty):
        def get_job(self, kind: str, job_id: str) -> ProviderJob:
            self._check("get_job", job_id)
            return self._inner.get_job(kind, job_id)

        def stop_job(self, kind: str, job_id: str) -> str:
            return self._inner.stop_job(kind, job_id)  # the stop itself works

    faulty = ReconcileFault(provider, {_pid(bad)})
    first = _run(settings, database, faulty)
    assert first["job_errors"][0]["ended"] is False and state(conn, bad) == "PROGRESS"
    second = _run(settings, database, faulty)
    assert second["job_errors"][0]["ended"] is True
    row = job(conn, bad)
    assert row["state"] == "FAIL" and row["failure_class"] == "permanent"
    assert "RuntimeError: injected fault" in row["error"]
    # The provider job does not run on unwatched: the tick stopped it (SFT: deleted).
    assert _pid(bad) not in sim.sim_jobs()
    assert state(conn, ids[1]) == "PROGRESS" and _pid(ids[1]) in sim.sim_jobs()


def test_a_success_resets_the_count(conn: psycopg.Connection[Any], settings: Settings,
                                    database: Database, provider: FireworksClient) -> None:
    settings = _with(settings, job_fault_limit=2)
    ids = _admit_and_submit(conn, settings, database, provider, _users(conn, 1))
    bad = ids[0]
    faulty = Faulty(provider, {_pid(bad)})
    _run(settings, database, faulty)
    assert fault_row(conn, bad)[0] == 1
    _run(settings, database, Faulty(provider, set()))  # handled fine: the run ends
    assert fault_row(conn, bad) is None
    _run(settings, database, faulty)
    assert fault_row(conn, bad)[0] == 1 and state(conn, bad) == "PROGRESS"


def test_a_different_fault_starts_the_count_again(conn: psycopg.Connection[Any]) -> None:
    alice = create_user(conn, "alice")
    j = enqueue(conn, alice, "SFT", gpus=4)

    def fault(tick_id: int, phase: str, kind: str) -> dict[str, Any]:
        row = conn.execute("SELECT sftq.record_job_fault(%s, %s, %s, %s, %s, 3)",
                           (j, tick_id, phase, kind, f"{kind}: boom")).fetchone()
        assert row is not None
        return dict(row[0])

    assert fault(1, "preflight", "InvalidURL")["faults"] == 1
    assert fault(1, "preflight", "InvalidURL")["faults"] == 1  # same tick: counted once
    assert fault(2, "preflight", "InvalidURL")["faults"] == 2
    assert fault(3, "preflight", "KeyError")["faults"] == 1  # another way: from 1 again
    assert fault(4, "preflight", "KeyError")["faults"] == 2
    ended = fault(5, "preflight", "KeyError")
    assert ended["ended"] is True and state(conn, j) == "FAIL"
    # Ended: further faults change nothing and write nothing.
    before = len(events(conn, j))
    assert fault(6, "preflight", "KeyError") == {"state": "FAIL", "faults": 0, "ended": False}
    assert len(events(conn, j)) == before


def test_limit_zero_records_but_never_ends(conn: psycopg.Connection[Any]) -> None:
    alice = create_user(conn, "alice")
    j = enqueue(conn, alice, "SFT", gpus=4)
    for tick_id in range(1, 6):
        conn.execute("SELECT sftq.record_job_fault(%s, %s, 'submit', 'ValueError', 'x', 0)",
                     (j, tick_id))
    assert state(conn, j) == "QUEUED" and len(tick_errors(conn, j)) == 5


def test_the_event_reads_as_a_sentence(conn: psycopg.Connection[Any]) -> None:
    alice = create_user(conn, "alice")
    j = enqueue(conn, alice, "SFT", gpus=4)
    conn.execute("SELECT sftq.record_job_fault(%s, 1, 'preflight', 'InvalidURL', "
                 "'InvalidURL: Invalid non-printable ASCII character in URL', 2)", (j,))
    conn.execute("SELECT sftq.record_job_fault(%s, 2, 'preflight', 'InvalidURL', "
                 "'InvalidURL: Invalid non-printable ASCII character in URL', 2)", (j,))
    rows = conn.execute("SELECT j ->> 'type', j ->> 'message' FROM sftq.job_events e, "
                        "LATERAL (SELECT sftq.event_json(e)::jsonb) AS x(j) "
                        "WHERE e.job_id = %s ORDER BY e.id", (j,)).fetchall()
    messages = [m for t, m in rows if t in ("tick_error", "failed")]
    assert messages[0].startswith("The scheduler could not handle it (preflight step: InvalidURL")
    assert "fault 1 of 2" in messages[0]
    assert "one time too many" in messages[1]
    assert messages[2].startswith("Failed: the scheduler could not handle it on 2 ticks in a row")


def test_a_database_that_is_gone_still_ends_the_tick(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not every error is one job's: a lost database ends the tick as before (no fault is
    pinned on the job being handled)."""
    from sftq_server.core.errors import Unavailable
    from sftq_server.scheduler.tick import submit as submit_module

    users = _users(conn, 2)
    ids = [enqueue(conn, u, "SFT", gpus=4) for u in users]

    def gone(*args: Any, **kwargs: Any) -> None:
        raise Unavailable("the database is not reachable right now; retry shortly")

    monkeypatch.setattr(submit_module, "submit", gone)
    answer = _run(settings, database, Faulty(provider, set()))
    assert answer["status"] == "error" and answer["job_errors"] == []
    assert any(e.startswith("database: the database is not reachable") for e in answer["errors"])
    assert all(fault_row(conn, i) is None for i in ids)


def test_a_bug_in_one_job_is_its_fault_not_the_ticks(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only the provider's errors: a bug in the tick's own code for one job (here a
    ValueError out of recording a create) is that job's fault."""
    from sftq_server.scheduler.tick import submit as submit_module

    users = _users(conn, 3)
    ids = [enqueue(conn, u, "SFT", gpus=4) for u in users]
    bad = ids[0]
    real = submit_module._record_submitted

    def buggy(tick: Any, job_id: uuid.UUID, *args: Any, **kwargs: Any) -> None:
        if job_id == bad:
            raise ValueError("a bug")
        real(tick, job_id, *args, **kwargs)

    monkeypatch.setattr(submit_module, "_record_submitted", buggy)
    answer = _run(settings, database, Faulty(provider, set()))
    assert [(e["job_id"], e["phase"]) for e in answer["job_errors"]] == [(str(bad), "submit")]
    assert answer["submitted"] == 2
    assert [e["detail"]["error_type"] for e in tick_errors(conn, bad)] == ["ValueError"]


def test_the_fault_path_runs_as_the_scheduler_role(
        conn: psycopg.Connection[Any], settings: Settings, db_url: str,
        provider: FireworksClient) -> None:
    """The tick's login role is only a member of sftq_scheduler: recording a fault, ending a
    job at the limit, and ending a run of faults must all be granted to it (a missing grant
    is SQLSTATE 42501, which ends the tick rather than being pinned on a job)."""
    role_db = Database(psycopg.conninfo.make_conninfo(db_url, options="-c role=sftq_scheduler"),
                       max_size=2, timeout=5.0)
    try:
        settings = _with(settings, preflight=True, job_fault_limit=2)
        users = _users(conn, 2)
        poison = f"accounts/{ACCOUNT}/datasets/poison"
        # users[0]: a running job keeps the poisoned one queued, where the pre-flight meets it.
        enqueue(conn, users[0], "SFT", gpus=4)
        bad = enqueue(conn, users[0], "SFT", gpus=4, body={**payload("SFT"), "dataset": poison})
        flaky = enqueue(conn, users[1], "SFT", gpus=4)
        first = run_tick_as(role_db, settings, Faulty(provider, {poison, _pid(flaky)}))
        assert not [e for e in first["errors"] if "permission denied" in e], first
        assert {e["job_id"] for e in first["job_errors"]} == {str(bad), str(flaky)}, first["errors"]
        second = run_tick_as(role_db, settings, Faulty(provider, {poison}))
        assert not [e for e in second["errors"] if "permission denied" in e], second
        assert state(conn, bad) == "FAIL"
        assert fault_row(conn, flaky) is None  # its retried create landed: the run ended
    finally:
        role_db.close()


def run_tick_as(db: Database, settings: Settings, faulty: Faulty) -> dict[str, Any]:
    from sftq_server.scheduler.tick import run_tick

    return run_tick(db, faulty, settings, holder="role-test")  # type: ignore[arg-type]


def test_an_error_that_quotes_the_payload_keeps_its_secrets_out(
        conn: psycopg.Connection[Any], settings: Settings, database: Database,
        provider: FireworksClient, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Invariant 8 holds on the fault path: an exception whose text quotes the payload (its
    wandbConfig.apiKey) is recorded with the secret redacted, in the event, the answer, the
    tick row and the log."""
    from sftq_server.scheduler.tick import submit as submit_module

    secret = "wandb-SECRET"
    assert payload("SFT")["wandbConfig"]["apiKey"] == secret
    [user] = _users(conn, 1)
    bad = enqueue(conn, user, "SFT", gpus=4)

    def quoting(tick: Any, job_id: uuid.UUID, kind: str, body: dict[str, Any],
                gpus: int) -> None:
        raise ValueError(f"cannot send {body!r}")

    monkeypatch.setattr(submit_module, "submit", quoting)
    caplog.set_level("WARNING", logger="sftq_server.scheduler.tick")
    answer = _run(settings, database, Faulty(provider, set()))
    [entry] = answer["job_errors"]
    assert "[REDACTED]" in entry["error"] and secret not in json.dumps(answer)
    assert secret not in json.dumps(recorded(conn, answer["tick_id"]))
    assert secret not in json.dumps([e["detail"] for e in events(conn, bad)], default=str)
    assert secret not in caplog.text and "[REDACTED]" in caplog.text
    assert "Traceback" in caplog.text  # the traceback is logged, redacted too
