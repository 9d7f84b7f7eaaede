"""The Fireworks provider client, against the in-process simulator and httpx.MockTransport."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from sftq_server.provider import (
    ID_PARAM,
    KIND_COLLECTION,
    AlreadyExists,
    AuthError,
    FireworksClient,
    NotFound,
    ProviderError,
    ProviderJob,
    Quota,
    RateLimited,
    Rejected,
    Transient,
    is_known_state,
    map_provider_state,
    normalize_state,
    parse_retry_after,
    provider_job_id,
)
from sftq_server.simulator import Simulator, SimulatorServer

SFT = {"baseModel": "accounts/fireworks/models/qwen3-8b", "dataset": "accounts/a/datasets/d"}
DPO = {"dataset": "accounts/a/datasets/p", "trainingConfig": {"baseModel": "m"}}
RFT = {
    "dataset": "accounts/a/datasets/r",
    "evaluator": "accounts/a/evaluators/e",
    "inferenceParameters": {"responseCandidatesCount": 4},
}
PAYLOADS: dict[str, dict[str, Any]] = {"SFT": SFT, "DPO": DPO, "RFT": RFT}
ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

MakeClient = Callable[..., FireworksClient]


# -- pure helpers ---------------------------------------------------------------------------


def test_provider_job_id_is_deterministic_and_valid() -> None:
    our_id = uuid.uuid4()
    derived = provider_job_id(our_id)
    assert derived == provider_job_id(str(our_id)) == provider_job_id(str(our_id).upper())
    assert derived == "sftq-" + our_id.hex
    assert len(derived) == 37
    assert ID_RE.match(derived)
    assert provider_job_id(uuid.uuid4()) != derived
    with pytest.raises(ValueError):
        provider_job_id("not-a-uuid")


def test_kind_tables_agree() -> None:
    assert set(KIND_COLLECTION) == set(ID_PARAM) == {"SFT", "DPO", "RFT"}
    assert KIND_COLLECTION["RFT"] == "reinforcementFineTuningJobs"
    assert ID_PARAM["DPO"] == "dpoJobId"


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("JOB_STATE_COMPLETED", "SUCCESS"),
        ("JOB_STATE_FAILED", "FAIL"),
        ("JOB_STATE_EXPIRED", "FAIL"),
        ("JOB_STATE_EARLY_STOPPED", "FAIL"),
        ("JOB_STATE_CANCELLED", "CANCELLED"),
        ("JOB_STATE_DELETED", "CANCELLED"),
        ("COMPLETED", "SUCCESS"),
        ("JOB_STATE_PAUSED", None),
        ("JOB_STATE_RUNNING", None),
        ("JOB_STATE_CREATING", None),
        ("JOB_STATE_CANCELLING", None),
        ("JOB_STATE_DELETING", None),
        ("JOB_STATE_UNSPECIFIED", None),
        ("", None),
        (None, None),
    ],
)
def test_map_provider_state(state: str | None, expected: str | None) -> None:
    assert map_provider_state(state) == expected


def test_unknown_state_counts_as_running_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = f"JOB_STATE_NEW_{uuid.uuid4().hex[:6].upper()}"
    with caplog.at_level(logging.WARNING, logger="sftq_server.provider"):
        assert map_provider_state(state) is None
        assert map_provider_state(state) is None
    assert [r.getMessage() for r in caplog.records].count(
        f"unknown Fireworks job state {state!r}: treating it as still running"
    ) == 1


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = time.time()
    later = datetime.fromtimestamp(now, tz=UTC) + timedelta(seconds=30)
    parsed = parse_retry_after(format_datetime(later, usegmt=True), now=now)
    assert parsed is not None and 29 <= parsed <= 31
    earlier = datetime.fromtimestamp(now, tz=UTC) - timedelta(seconds=30)
    assert parse_retry_after(format_datetime(earlier, usegmt=True), now=now) == 0.0


def test_quota_parses_strings_and_numbers() -> None:
    quota = Quota.from_resource(
        {"name": "accounts/a/quotas/q", "value": "24", "maxValue": "32", "usage": 8}
    )
    assert (quota.value, quota.max_value, quota.usage, quota.limit) == (24, 32, 8.0, 24)
    assert quota.available == 16
    as_numbers = Quota.from_resource({"value": 40, "maxValue": 32.0, "usage": "4.5"})
    assert (as_numbers.limit, as_numbers.usage) == (32, 4.5)
    # proto3 JSON drops zeros: no usage means 0; no value at all falls back to maxValue.
    sparse = Quota.from_resource({"maxValue": "16"})
    assert (sparse.value, sparse.max_value, sparse.usage, sparse.limit) == (16, 16, 0.0, 16)
    with pytest.raises(ProviderError):
        Quota.from_resource({"maxValue": "lots"})


# -- against the simulator ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["SFT", "DPO", "RFT"])
def test_create_then_get(client: FireworksClient, sim: Simulator, kind: str) -> None:
    job_id = provider_job_id(uuid.uuid4())
    created = client.create_job(kind, job_id, PAYLOADS[kind], gpu_count=8)
    name = f"accounts/sim-account/{KIND_COLLECTION[kind]}/{job_id}"
    assert (created.name, created.job_id, created.kind) == (name, job_id, kind)
    assert created.state == "JOB_STATE_CREATING"
    assert created.outcome is None
    assert created.raw["dataset"] == PAYLOADS[kind]["dataset"]

    fetched = client.get_job(kind, job_id)
    assert fetched.name == name and fetched.raw["createTime"] == created.raw["createTime"]

    (sent,) = [r for r in sim.requests() if r["method"] == "POST"]
    assert sent["path"] == f"/v1/accounts/sim-account/{KIND_COLLECTION[kind]}"
    assert sent["query"] == {ID_PARAM[kind]: job_id}
    assert sent["body"] == PAYLOADS[kind]
    assert sent["gpu_count"] == "8"


def test_job_lifecycle_follows_the_clock(
    client: FireworksClient, advance: Callable[[float], None]
) -> None:
    client.create_job("SFT", "life", SFT)
    assert client.get_job("SFT", "life").state == "JOB_STATE_CREATING"
    advance(1.0)
    running = client.get_job("SFT", "life")
    assert running.state == "JOB_STATE_RUNNING" and running.outcome is None
    advance(59.0)
    done = client.get_job("SFT", "life")
    assert done.state == "JOB_STATE_COMPLETED" and done.outcome == "SUCCESS"
    assert "completedTime" in done.raw


def test_failed_job_carries_status_message(client: FireworksClient, sim: Simulator) -> None:
    client.create_job("DPO", "will-fail", DPO)
    sim.finish("dpoJobs", "will-fail", "JOB_STATE_FAILED", "OOM on node 3")
    job = client.get_job("DPO", "will-fail")
    assert (job.state, job.outcome, job.message) == ("JOB_STATE_FAILED", "FAIL", "OOM on node 3")


def test_retried_create_is_already_exists_and_adoptable(client: FireworksClient) -> None:
    job_id = provider_job_id(uuid.uuid4())
    first = client.create_job("SFT", job_id, SFT, gpu_count=4)
    with pytest.raises(AlreadyExists) as caught:
        client.create_job("SFT", job_id, SFT, gpu_count=4)
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["code"] == 6
    assert "already exists" in str(caught.value)
    assert not isinstance(caught.value, Rejected | Transient)
    # The adoption path: the scheduler GETs the job it created on the earlier try.
    assert client.get_job("SFT", job_id).name == first.name


def test_create_after_rft_cancel_is_still_already_exists(client: FireworksClient) -> None:
    client.create_job("RFT", "rft-once", RFT)
    client.cancel_job("RFT", "rft-once")
    with pytest.raises(AlreadyExists):
        client.create_job("RFT", "rft-once", RFT)


def test_list_follows_page_tokens_across_more_than_200_jobs(
    client: FireworksClient, sim: Simulator
) -> None:
    ids = {provider_job_id(uuid.uuid4()) for _ in range(230)}
    for job_id in ids:
        client.create_job("SFT", job_id, SFT)
    client.create_job("DPO", "other-kind", DPO)
    sim.clear_requests()
    before = client.calls_made

    listed = [job.job_id for job in client.list_jobs("SFT")]

    assert sorted(listed) == sorted(ids) and len(listed) == len(ids)
    assert client.calls_made - before == 2
    first, second = sim.requests()
    assert first["query"] == {"pageSize": "200"}
    assert second["query"]["pageSize"] == "200" and second["query"]["pageToken"]


def test_list_small_pages(client: FireworksClient, sim: Simulator) -> None:
    for n in range(23):
        client.create_job("DPO", f"dpo-{n:02d}", DPO)
    sim.clear_requests()
    listed = [job.job_id for job in client.list_jobs("DPO", page_size=5)]
    assert listed == [f"dpo-{n:02d}" for n in range(23)]
    assert len(sim.requests()) == 5
    assert list(client.list_jobs("RFT")) == []
    with pytest.raises(ValueError):
        list(client.list_jobs("DPO", page_size=201))


def test_delete_then_404(client: FireworksClient, sim: Simulator) -> None:
    client.create_job("SFT", "to-delete", SFT, gpu_count=8)
    assert client.get_quota().usage == 8
    client.delete_job("SFT", "to-delete")
    with pytest.raises(NotFound) as caught:
        client.get_job("SFT", "to-delete")
    assert caught.value.status == 404
    assert client.get_quota().usage == 0
    with pytest.raises(NotFound):
        client.delete_job("SFT", "to-delete")
    # Stopping what is already gone is success, not an error.
    assert client.stop_job("SFT", "to-delete") == "delete"
    # After a delete the id is free again.
    client.create_job("SFT", "to-delete", SFT)


def test_stop_job_uses_the_kind_specific_call(client: FireworksClient, sim: Simulator) -> None:
    client.create_job("SFT", "s1", SFT)
    client.create_job("DPO", "d1", DPO)
    client.create_job("RFT", "r1", RFT)
    sim.clear_requests()
    assert client.stop_job("SFT", "s1") == "delete"
    assert client.stop_job("DPO", "d1") == "delete"
    assert client.stop_job("RFT", "r1") == "cancel"
    calls = [(r["method"], r["path"].rsplit("/", 1)[-1], r["body"]) for r in sim.requests()]
    assert calls == [("DELETE", "s1", None), ("DELETE", "d1", None), ("POST", "r1:cancel", {})]
    rft = client.get_job("RFT", "r1")
    assert (rft.state, rft.outcome) == ("JOB_STATE_CANCELLED", "CANCELLED")
    assert client.stop_job("RFT", "never-existed") == "cancel"


def test_rft_cancel_keeps_the_resource(client: FireworksClient) -> None:
    client.create_job("RFT", "rft-keep", RFT, gpu_count=16)
    assert client.get_quota().usage == 16
    client.cancel_job("RFT", "rft-keep")
    job = client.get_job("RFT", "rft-keep")
    assert job.state == "JOB_STATE_CANCELLED"
    assert [j.job_id for j in client.list_jobs("RFT")] == ["rft-keep"]
    assert client.get_quota().usage == 0


def test_wrong_call_for_kind_is_a_programming_error(client: FireworksClient) -> None:
    with pytest.raises(ValueError):
        client.delete_job("RFT", "x1")
    with pytest.raises(ValueError):
        client.cancel_job("SFT", "x1")
    with pytest.raises(ValueError):
        client.create_job("PPO", "x1", SFT)
    with pytest.raises(ValueError):
        client.get_job("SFT", "Bad_ID")
    with pytest.raises(ValueError):
        client.get_job("SFT", "../../quotas/training-h200-count")
    assert client.calls_made == 0


@pytest.mark.parametrize(
    ("kind", "payload", "needle"),
    [
        ("SFT", {"baseModel": "m"}, '"dataset"'),
        ("DPO", {"trainingConfig": {}}, '"dataset"'),
        (
            "RFT",
            {"dataset": "d", "inferenceParameters": {"responseCandidatesCount": 4}},
            "evaluator",
        ),
        ("RFT", {"dataset": "d", "evaluator": "e"}, "responseCandidatesCount"),
        (
            "RFT",
            {
                "dataset": "d",
                "evaluator": "e",
                "inferenceParameters": {"responseCandidatesCount": 1},
            },
            "responseCandidatesCount",
        ),
    ],
)
def test_validation_400_is_rejected_with_body_verbatim(
    client: FireworksClient,
    http: httpx.Client,
    kind: str,
    payload: dict[str, object],
    needle: str,
) -> None:
    with pytest.raises(Rejected) as caught:
        client.create_job(kind, "bad-job", payload)
    error = caught.value
    assert error.status == 400 and not isinstance(error, AuthError)
    assert needle in str(error) and error.provider_message and needle in error.provider_message
    # The very same bytes the server sent: what the job's `error` field will show.
    direct = http.post(
        f"/v1/accounts/sim-account/{KIND_COLLECTION[kind]}",
        params={ID_PARAM[kind]: "bad-job"},
        json=payload,
    )
    assert direct.status_code == 400
    assert error.body == direct.text
    assert json.loads(error.body) == {"code": 3, "message": error.provider_message, "details": []}
    with pytest.raises(NotFound):
        client.get_job(kind, "bad-job")


def test_quota_strings_are_parsed(client: FireworksClient, sim: Simulator) -> None:
    sim.set_quota(max_value=32, value=24)
    quota = client.get_quota()
    assert quota.name == "accounts/sim-account/quotas/training-h200-count"
    assert (quota.max_value, quota.value, quota.limit, quota.usage) == (32, 24, 24, 0.0)
    # The account lists its other quotas too (paged; see test_quotas_are_paged).
    listed = {q.name: q for q in client.list_quotas()}
    assert listed[quota.name] == quota and len(listed) > 1


def test_quota_usage_counts_running_jobs_and_external_usage(
    client: FireworksClient, sim: Simulator
) -> None:
    client.create_job("SFT", "a1", SFT, gpu_count=8)
    client.create_job("DPO", "a2", DPO, gpu_count=16)
    client.create_job("RFT", "a3", RFT)  # no header, no hints: 4
    assert client.get_quota().usage == 28
    sim.set_quota(external_usage=10)
    assert client.get_quota().usage == 38
    sim.finish("SFT", "a1", "JOB_STATE_COMPLETED")
    assert client.get_quota().usage == 30


def test_quota_usage_lags_new_jobs(
    client: FireworksClient, sim: Simulator, advance: Callable[[float], None]
) -> None:
    sim.set_quota(usage_lag_seconds=20)
    client.create_job("SFT", "lagging", SFT, gpu_count=8)
    assert client.get_quota().usage == 0
    advance(19.9)
    assert client.get_quota().usage == 0
    advance(0.2)
    assert client.get_quota().usage == 8


def test_quota_unknown_id_is_not_found(make_client: MakeClient) -> None:
    other = make_client(quota_id="training-x9-count")
    with pytest.raises(NotFound):
        other.get_quota()


# -- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_injected_5xx_is_transient(client: FireworksClient, sim: Simulator, status: int) -> None:
    sim.set_faults(error_rate=1.0, statuses=[status])
    with pytest.raises(Transient) as caught:
        client.create_job("SFT", "faulty", SFT)
    assert caught.value.status == status and caught.value.retry_after is None
    assert json.loads(caught.value.body)["message"].startswith("injected fault")
    sim.set_faults()
    with pytest.raises(NotFound):  # the faulted create was never applied
        client.get_job("SFT", "faulty")
    assert [r["fault"] for r in sim.requests()] == [str(status), None]


def test_injected_429_carries_retry_after(client: FireworksClient, sim: Simulator) -> None:
    sim.set_faults(error_rate=1.0, statuses=[429])
    with pytest.raises(Transient) as caught:
        client.get_quota()
    assert caught.value.status == 429
    assert caught.value.retry_after == 1.0


def test_injected_timeout_is_transient_and_not_applied(
    make_client: MakeClient, sim: Simulator
) -> None:
    impatient = make_client(timeout=0.2)
    sim.set_faults(timeout_rate=1.0, timeout_seconds=3.0)
    started = time.monotonic()
    with pytest.raises(Transient) as caught:
        impatient.create_job("SFT", "slow-one", SFT)
    assert time.monotonic() - started < 2.0
    assert caught.value.status is None and "timed out" in str(caught.value)
    sim.set_faults()
    with pytest.raises(NotFound):
        impatient.get_job("SFT", "slow-one")
    assert [r["fault"] for r in sim.requests()] == ["timeout", None]


def test_latency_under_the_timeout_is_fine(make_client: MakeClient, sim: Simulator) -> None:
    sim.set_faults(latency_ms=50)
    started = time.monotonic()
    assert make_client(timeout=2.0).get_quota().limit == 64
    assert time.monotonic() - started >= 0.05


def test_mixed_faults_eventually_succeed_with_the_same_id(
    client: FireworksClient, sim: Simulator
) -> None:
    # What the scheduler does across ticks: retry the create with the derived id until it
    # lands, then adopt on 409. The job must exist exactly once. (5xx only: a 429 holds
    # every call for its Retry-After, test_a_429_holds_every_call_for_its_retry_after.)
    sim.set_faults(error_rate=0.5, statuses=[500, 502, 503], timeout_rate=0.0)
    job_id = provider_job_id(uuid.uuid4())
    outcomes = []
    for _ in range(40):
        try:
            client.create_job("SFT", job_id, SFT)
            outcomes.append("created")
        except AlreadyExists:
            outcomes.append("exists")
        except Transient:
            outcomes.append("transient")
    assert outcomes.count("created") == 1
    assert "transient" in outcomes and "exists" in outcomes
    sim.set_faults()
    assert [j.job_id for j in client.list_jobs("SFT")] == [job_id]


def test_connection_refused_is_transient(api_key: str) -> None:
    with SimulatorServer() as srv:
        url = srv.url
    gone = FireworksClient(base_url=url, api_key=api_key, account_id="a", timeout=1.0)
    with gone, pytest.raises(Transient) as caught:
        gone.get_quota()
    assert caught.value.status is None and "connection failed" in str(caught.value)
    assert api_key not in str(caught.value)


# -- classification with httpx.MockTransport ------------------------------------------------


def _answer(
    status: int, body: str = '{"code": 3, "message": "nope"}', **headers: str
) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=body, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("status", "op", "expected"),
    [
        (400, "create", Rejected),
        (400, "get", Rejected),
        (401, "create", AuthError),
        (403, "get", AuthError),
        (404, "get", NotFound),
        (404, "delete", NotFound),
        (404, "cancel", NotFound),
        (404, "quota", NotFound),
        (404, "create", Rejected),
        (408, "create", Transient),
        # A 409 whose body is not ALREADY_EXISTS (here INVALID_ARGUMENT): see below.
        (409, "create", Transient),
        (412, "create", Rejected),
        (422, "create", Rejected),
        (429, "create", RateLimited),
        (500, "get", Transient),
        (502, "delete", Transient),
        (503, "cancel", Transient),
        (504, "quota", Transient),
        (599, "create", Transient),
        (302, "get", ProviderError),
    ],
)
def test_status_classification(
    mocked: Callable[..., FireworksClient], status: int, op: str, expected: type[ProviderError]
) -> None:
    client = mocked(_answer(status))
    calls: dict[str, Callable[[], object]] = {
        "create": lambda: client.create_job("SFT", "j1", SFT),
        "get": lambda: client.get_job("SFT", "j1"),
        "delete": lambda: client.delete_job("DPO", "j1"),
        "cancel": lambda: client.cancel_job("RFT", "j1"),
        "quota": client.get_quota,
    }
    with pytest.raises(ProviderError) as caught:
        calls[op]()
    assert type(caught.value) is expected
    assert caught.value.status == status
    assert caught.value.body == '{"code": 3, "message": "nope"}'
    if expected is AuthError:
        assert isinstance(caught.value, Rejected)


def test_retry_after_seconds_and_http_date(mocked: Callable[..., FireworksClient]) -> None:
    with pytest.raises(Transient) as caught:
        mocked(_answer(503, **{"Retry-After": "7"})).get_quota()
    assert caught.value.retry_after == 7.0
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    with pytest.raises(Transient) as caught:
        mocked(_answer(429, **{"Retry-After": when})).get_quota()
    assert caught.value.retry_after is not None and 55 <= caught.value.retry_after <= 61


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"code": 3, "message": "grpc-gateway shape"}', "grpc-gateway shape"),
        ('{"error": {"message": "nested shape", "code": 400}}', "nested shape"),
        ('{"message": "flat shape"}', "flat shape"),
        ('{"error": "string shape"}', "string shape"),
        ("<html>Bad Gateway</html>", None),
        ("", None),
    ],
)
def test_error_body_shapes(
    mocked: Callable[..., FireworksClient], body: str, message: str | None
) -> None:
    with pytest.raises(Rejected) as caught:
        mocked(_answer(400, body)).create_job("SFT", "j1", SFT)
    assert caught.value.body == body
    assert caught.value.provider_message == message
    if message:
        assert message in str(caught.value)


def test_unreadable_success_is_transient(mocked: Callable[..., FireworksClient]) -> None:
    with pytest.raises(Transient):
        mocked(_answer(200, "<html>proxy</html>")).get_job("SFT", "j1")
    with pytest.raises(Transient):
        mocked(_answer(200, "[1, 2]")).get_job("SFT", "j1")


@pytest.mark.parametrize(
    "exc",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("eof")],
)
def test_transport_errors_are_transient(
    mocked: Callable[..., FireworksClient], exc: httpx.TransportError
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(Transient) as caught:
        mocked(handler).get_job("SFT", "j1")
    assert caught.value.status is None and caught.value.__cause__ is exc


def test_requests_carry_timeout_key_and_gpu_header(mocked: Callable[..., FireworksClient]) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"name": "accounts/acct/supervisedFineTuningJobs/j1"})

    client = mocked(handler, timeout=2.5)
    client.create_job("SFT", "j1", SFT, gpu_count=12)
    client.create_job("SFT", "j2", SFT)
    client.get_job("SFT", "j1")
    assert client.calls_made == 3
    for request in seen:
        assert request.extensions["timeout"] == {
            "connect": 2.5,
            "read": 2.5,
            "write": 2.5,
            "pool": 2.5,
        }
        assert request.headers["Authorization"].startswith("Bearer fw-SECRET")
    assert seen[0].headers["X-Sftq-Gpu-Count"] == "12"
    assert "X-Sftq-Gpu-Count" not in seen[1].headers
    assert str(seen[0].url) == (
        "https://fireworks.test/v1/accounts/acct/supervisedFineTuningJobs"
        "?supervisedFineTuningJobId=j1"
    )
    assert json.loads(seen[0].content) == SFT


def test_repeated_page_token_stops_the_listing(mocked: Callable[..., FireworksClient]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"dpoJobs": [{"name": "x/dpoJobs/a"}], "nextPageToken": "t"}
        )

    with pytest.raises(ProviderError, match="repeated"):
        list(mocked(handler).list_jobs("DPO"))


# -- the key never leaks --------------------------------------------------------------------


def test_api_key_never_in_errors_reprs_or_logs(
    mocked: Callable[..., FireworksClient],
    client: FireworksClient,
    sim: Simulator,
    api_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        # A hostile or debugging proxy that echoes our headers back in its error body.
        return httpx.Response(
            400, json={"message": f"bad header {request.headers['Authorization']}"}
        )

    caught: list[ProviderError] = []
    with caplog.at_level(logging.DEBUG):
        echoing = mocked(echo)
        try:
            echoing.create_job("SFT", "j1", SFT)
        except ProviderError as exc:
            caught.append(exc)
        sim.set_faults(error_rate=1.0, statuses=[503])
        for call in (lambda: client.create_job("SFT", "j1", SFT), client.get_quota):
            try:
                call()
            except ProviderError as exc:
                caught.append(exc)
        sim.set_faults()
        client.create_job("SFT", "j2", SFT)
        try:
            client.create_job("SFT", "j2", SFT)
        except ProviderError as exc:
            caught.append(exc)

    assert len(caught) == 4
    for error in caught:
        texts = (str(error), repr(error), error.body, str(error.args), error.provider_message or "")
        for text in texts:
            assert api_key not in text
    assert "[redacted]" in caught[0].body
    assert api_key not in repr(client) and api_key not in repr(echoing)
    assert caplog.records, "expected debug logs from the client"
    for record in caplog.records:
        assert api_key not in record.getMessage()
        assert api_key not in str(record.args)


# -- configuration --------------------------------------------------------------------------


def test_from_env(server: SimulatorServer, api_key: str) -> None:
    env = {
        "FIREWORKS_API_KEY": api_key,
        "FIREWORKS_ACCOUNT_ID": "sim-account",
        "FIREWORKS_BASE_URL": server.url,
        "FIREWORKS_QUOTA_ID": "training-h200-count",
        "FIREWORKS_TIMEOUT": "2.5",
    }
    with FireworksClient.from_env(env) as configured:
        assert configured.timeout == 2.5 and configured.base_url == server.url
        assert configured.get_quota().limit == 64

    with FireworksClient.from_env({"FIREWORKS_API_KEY": "k", "FIREWORKS_ACCOUNT_ID": "a"}) as dflt:
        assert dflt.base_url == "https://api.fireworks.ai"
        assert (dflt.quota_id, dflt.timeout) == ("training-h200-count", 10.0)

    for broken in (
        {"FIREWORKS_ACCOUNT_ID": "a"},
        {"FIREWORKS_API_KEY": "k"},
        {"FIREWORKS_API_KEY": "k", "FIREWORKS_ACCOUNT_ID": "a", "FIREWORKS_TIMEOUT": "soon"},
        {"FIREWORKS_API_KEY": "k", "FIREWORKS_ACCOUNT_ID": "a", "FIREWORKS_TIMEOUT": "0"},
    ):
        with pytest.raises(ValueError):
            FireworksClient.from_env(broken)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"code": 6, "message": "job \\"x\\" already exists"}', AlreadyExists),
        ('{"code": "ALREADY_EXISTS", "message": "exists"}', AlreadyExists),
        ('{"error": {"code": 409, "status": "ALREADY_EXISTS", "message": "m"}}', AlreadyExists),
        ('{"message": "supervisedFineTuningJob already exists"}', AlreadyExists),
        ('{"code": 10, "message": "ABORTED: concurrent modification"}', Transient),
        ('{"code": "ABORTED", "message": "already exists? no: aborted"}', Transient),
        ('{"error": {"status": "ABORTED", "message": "try again"}}', Transient),
        ("", Transient),
        ("<html>conflict</html>", Transient),
    ],
)
def test_only_already_exists_is_an_adoption(
    mocked: Callable[..., FireworksClient], body: str, expected: type[ProviderError]
) -> None:
    client = mocked(_answer(409, body))
    with pytest.raises(ProviderError) as caught:
        client.create_job("SFT", "j1", SFT)
    assert type(caught.value) is expected
    assert caught.value.body == body  # kept verbatim either way


@pytest.mark.parametrize(
    ("state", "normalized", "outcome", "known"),
    [
        ("COMPLETED", "JOB_STATE_COMPLETED", "SUCCESS", True),
        ("completed", "JOB_STATE_COMPLETED", "SUCCESS", True),
        ("FAILED", "JOB_STATE_FAILED", "FAIL", True),
        ("EXPIRED", "JOB_STATE_EXPIRED", "FAIL", True),
        ("DELETED", "JOB_STATE_DELETED", "CANCELLED", True),
        ("RUNNING", "JOB_STATE_RUNNING", None, True),
        ("JOB_STATE_WRITING_RESULTS", "JOB_STATE_WRITING_RESULTS", None, True),
        ("WARMING_UP", "JOB_STATE_WARMING_UP", None, False),
        (" ", None, None, False),
    ],
)
def test_states_with_or_without_the_prefix(
    state: str, normalized: str | None, outcome: str | None, known: bool
) -> None:
    assert normalize_state(state) == normalized
    assert map_provider_state(state) == outcome
    assert is_known_state(state) is known


def test_job_progress_status_code_and_cost_are_read() -> None:
    job = ProviderJob.from_resource(
        "SFT",
        {
            "name": "accounts/a/supervisedFineTuningJobs/j",
            "state": "JOB_STATE_FAILED",
            "status": {"code": 8, "message": "out of capacity"},
            "jobProgress": {"percent": 42.5, "epoch": "2"},
            "estimatedCost": {"currencyCode": "USD", "units": "3"},
        },
    )
    assert (job.status_code, job.progress_percent, job.progress_epoch) == (
        "RESOURCE_EXHAUSTED",
        42.5,
        2,
    )
    assert job.estimated_cost == {"currencyCode": "USD", "units": "3"}
    bare = ProviderJob.from_resource("DPO", {"status": {"code": "internal"}, "jobProgress": 7})
    assert (bare.status_code, bare.progress_percent, bare.progress_epoch) == (
        "INTERNAL",
        None,
        None,
    )
    assert bare.estimated_cost is None
