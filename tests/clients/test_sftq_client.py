"""The Python client against an in-memory jobs-api (httpx.MockTransport): no network, no sleep."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeClock, FakeJobsApi, error

import sftq_client
from sftq_client import (
    AmbiguousJobId,
    APIConnectionError,
    BadRequest,
    CancelResult,
    Client,
    ConfigurationError,
    Conflict,
    Job,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    SftqError,
    SubmitResult,
    Timeout,
    Unauthorized,
    WaitTimeout,
)

PAYLOAD: dict[str, Any] = {
    "baseModel": "accounts/fireworks/models/qwen3-14b",
    "dataset": "accounts/trilogy/datasets/edullm-ela-sft-v3-thinking",
    "outputModel": "accounts/trilogy/models/edullm-ela-qwen3-14b-baseline-v1",
    "epochs": 3,
}


def body_of(request: httpx.Request) -> Any:
    return json.loads(request.content)


# ---- configuration ------------------------------------------------------------------------------


def test_env_sftq_api_url_wins_over_supabase_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SFTQ_API_URL", "http://127.0.0.1:8080/functions/v1/jobs-api/")
    monkeypatch.setenv("SUPABASE_URL", "https://example.supabase.co")
    with Client() as c:
        assert c.base_url == "http://127.0.0.1:8080/functions/v1/jobs-api"


def test_env_supabase_url_gets_the_jobs_api_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SUPABASE_URL", "https://example.supabase.co/")
    with Client() as c:
        assert c.base_url == "https://example.supabase.co/functions/v1/jobs-api"


def test_explicit_arguments_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_KEY", "sftq_from_env")
    monkeypatch.setenv("SFTQ_API_URL", "https://env.example/functions/v1/jobs-api")
    api = FakeJobsApi()
    with Client(API_KEY, BASE_URL, transport=api.transport()) as c:
        c.health()
    request = api.requests[0]
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert str(request.url) == f"{BASE_URL}/health"


def test_missing_api_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_URL", BASE_URL)
    with pytest.raises(ConfigurationError, match="SFTQ_API_KEY"):
        Client()


def test_missing_base_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    with pytest.raises(ConfigurationError, match="SFTQ_API_URL.*SUPABASE_URL"):
        Client()


def test_base_url_must_be_http() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        Client(API_KEY, "ftp://example.com")


def test_default_headers(api: FakeJobsApi, client: Client) -> None:
    client.get(api.add_job()["id"])
    headers = api.requests[0].headers
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert headers["user-agent"] == f"sftq-client/{sftq_client.__version__}"
    assert headers["accept"] == "application/json"


def test_client_package_does_not_import_the_server() -> None:
    code = (
        "import sys, sftq_client, sftq_client.cli\n"
        "leaked = [m for m in sys.modules if m.split('.')[0] == 'sftq_server']\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- submit and idempotency ---------------------------------------------------------------------


def test_submit_sends_the_contract_envelope(api: FakeJobsApi, client: Client) -> None:
    result = client.submit("SFT", PAYLOAD, display_name="baseline", gpu_count=8)
    assert isinstance(result, SubmitResult)
    assert result.kind == "SFT" and result.state == "QUEUED"
    assert result.created_at.tzinfo is not None
    request = api.requests[0]
    assert request.method == "POST" and str(request.url) == f"{BASE_URL}/jobs"
    assert request.headers["content-type"] == "application/json"
    assert body_of(request) == {
        "kind": "SFT",
        "fireworks_payload": PAYLOAD,
        "display_name": "baseline",
        "gpu_count": 8,
    }


def test_submit_after_and_max_run_seconds(api: FakeJobsApi, client: Client) -> None:
    # Issue 53: a pipeline names earlier jobs by id, prefix or the object submit() returned.
    sft = client.submit("SFT", PAYLOAD)
    client.submit("DPO", PAYLOAD, after=[sft, "0123abcd"], max_run_seconds=3600)
    assert body_of(api.requests[1]) == {"kind": "DPO", "fireworks_payload": PAYLOAD,
                                        "after": [sft.id, "0123abcd"], "max_run_seconds": 3600}
    with pytest.raises(TypeError):
        client.submit("DPO", PAYLOAD, after=sft.id)  # type: ignore[arg-type]


def test_submit_leaves_optional_fields_to_the_server(api: FakeJobsApi, client: Client) -> None:
    client.submit("DPO", PAYLOAD)
    assert body_of(api.requests[0]) == {"kind": "DPO", "fireworks_payload": PAYLOAD}


def test_submit_generates_a_fresh_uuid4_idempotency_key(api: FakeJobsApi, client: Client) -> None:
    first = client.submit("SFT", PAYLOAD)
    second = client.submit("SFT", PAYLOAD)
    keys = [r.headers["idempotency-key"] for r in api.requests]
    assert all(uuid.UUID(k).version == 4 for k in keys)
    assert keys[0] != keys[1]
    assert first.id != second.id


def test_idempotency_key_is_the_same_on_every_retry(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    api.script = [
        error(503, "database unavailable", "unavailable", headers={"Retry-After": "1"}),
        httpx.ConnectError("connection reset"),
        httpx.ReadTimeout("read timed out"),
    ]
    result = client.submit("SFT", PAYLOAD)
    keys = {r.headers["idempotency-key"] for r in api.requests}
    assert len(api.requests) == 4 and len(keys) == 1
    assert len(api.jobs) == 1 and result.id in api.jobs
    assert len(clock.sleeps) == 3


def test_retried_post_that_already_landed_is_deduplicated(api: FakeJobsApi, client: Client) -> None:
    # The first POST reaches the server but its answer is lost: the retry must not create a twin.
    def land_then_fail(request: httpx.Request) -> httpx.Response:
        api.route(request)
        raise httpx.ReadError("connection dropped after the server committed")

    api.script = [land_then_fail]
    result = client.submit("RFT", PAYLOAD)
    assert len(api.jobs) == 1 and result.id in api.jobs


def test_caller_supplied_idempotency_key_replays(api: FakeJobsApi, client: Client) -> None:
    a = client.submit("SFT", PAYLOAD, idempotency_key="run-42")
    b = client.submit("SFT", PAYLOAD, idempotency_key="run-42")
    assert a == b
    assert [r.headers["idempotency-key"] for r in api.requests] == ["run-42", "run-42"]


def test_submit_rejects_a_non_mapping_payload(client: Client) -> None:
    with pytest.raises(TypeError, match="mapping"):
        client.submit("SFT", ["not", "an", "object"])  # type: ignore[arg-type]


# ---- retries ------------------------------------------------------------------------------------


def test_retry_after_seconds_is_honoured(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    job = api.add_job()
    api.script = [error(429, "slow down", "rate_limited", headers={"Retry-After": "7"})]
    assert client.get(job["id"]).id == job["id"]
    assert clock.sleeps == [7.0]


def test_retry_after_http_date_is_honoured(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    job = api.add_job()
    when = datetime.now(UTC) + timedelta(seconds=30)
    api.script = [error(503, "busy", "unavailable", headers={"Retry-After": format_datetime(when)})]
    client.get(job["id"])
    assert len(clock.sleeps) == 1 and 25 <= clock.sleeps[0] <= 31


def test_exponential_backoff_with_jitter(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    job = api.add_job()
    api.script = [error(502, "bad gateway", "internal")] * 3
    client.get(job["id"])
    assert len(clock.sleeps) == 3
    for attempt, slept in enumerate(clock.sleeps):
        nominal = 0.5 * 2**attempt
        assert 0.75 * nominal <= slept <= nominal


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retryable_statuses(api: FakeJobsApi, client: Client, status: int) -> None:
    job = api.add_job()
    api.script = [httpx.Response(status)]
    assert client.get(job["id"]).id == job["id"]
    assert len(api.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 501])
def test_non_retryable_statuses(api: FakeJobsApi, client: Client, status: int) -> None:
    api.script = [error(status, "nope", "some_code")]
    with pytest.raises(SftqError):
        client.get("any")
    # Not retried. (After a 404 the client asks GET /health once, to tell "no such job" from a
    # base URL that is not the jobs-api at all.)
    assert len([r for r in api.requests if r.url.path.endswith("/jobs/any")]) == 1


def test_gives_up_after_max_retries_with_the_last_error(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    api.script = [
        error(503, "scheduler database is down", "unavailable", headers={"Retry-After": "2"})
    ] * 10
    with pytest.raises(ServiceUnavailable) as info:
        client.list_jobs()
    assert len(api.requests) == 4  # the first try and max_retries=3 retries
    assert info.value.attempts == 4
    assert clock.sleeps == [2.0, 2.0, 2.0]
    assert info.value.retry_after == 2.0
    assert info.value.code == "unavailable"


def test_a_very_long_retry_after_is_reported_not_waited(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    api.script = [error(503, "maintenance", "unavailable", headers={"Retry-After": "3600"})]
    with pytest.raises(ServiceUnavailable) as info:
        client.list_jobs()
    assert clock.sleeps == [] and info.value.retry_after == 3600.0


def test_max_retries_zero_means_one_attempt(api: FakeJobsApi) -> None:
    api.script = [httpx.Response(500)]
    with (
        Client(API_KEY, BASE_URL, max_retries=0, transport=api.transport()) as c,
        pytest.raises(ServerError),
    ):
        c.list_jobs()
    assert len(api.requests) == 1


def test_connection_errors_are_retried_then_raised(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    api.script = [httpx.ConnectError("connection refused")] * 4
    with pytest.raises(APIConnectionError) as info:
        client.list_jobs()
    assert not isinstance(info.value, Timeout)
    assert len(api.requests) == 4 and len(clock.sleeps) == 3
    assert "connection refused" in str(info.value) and "/jobs" in str(info.value)
    assert info.value.status is None


def test_timeouts_raise_timeout(api: FakeJobsApi, client: Client) -> None:
    api.script = [httpx.ReadTimeout("timed out")] * 4
    with pytest.raises(Timeout):
        client.get("abc")


def test_delete_is_retried(api: FakeJobsApi, client: Client) -> None:
    job = api.add_job()
    api.script = [httpx.Response(504)]
    assert client.cancel(job["id"]).state == "CANCELLED"
    assert [r.method for r in api.requests] == ["DELETE", "DELETE"]


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "missing_payload", BadRequest),
        (400, "validation_error", BadRequest),
        (401, "unauthorized", Unauthorized),
        (404, "not_found", NotFound),
        (409, "job_terminal", Conflict),
        (409, "idempotency_conflict", Conflict),
        (413, "payload_too_large", PayloadTooLarge),
        (415, "unsupported_media_type", BadRequest),
        (429, "rate_limited", RateLimited),
        (500, "internal", ServerError),
        (503, "unavailable", ServiceUnavailable),
    ],
)
def test_typed_errors_per_status(
    api: FakeJobsApi, status: int, code: str, cls: type[SftqError]
) -> None:
    # Four for the retried statuses; a 404 is answered once (the /health probe after it then
    # reaches the fake's router, which has one).
    times = 1 if status == 404 else 4
    api.script = [error(status, "server says no", code, details={"field": "x"})] * times
    with Client(API_KEY, BASE_URL, transport=api.transport()) as c, pytest.raises(cls) as info:
        c.list_jobs()
    exc = info.value
    assert (exc.status, exc.code, exc.message) == (status, code, "server says no")
    assert exc.body == {"error": "server says no", "code": code, "details": {"field": "x"}}
    assert exc.details == {"field": "x"}
    assert str(exc) == f"server says no ({status} {code})"


def test_unmapped_status_is_a_plain_sftq_error(api: FakeJobsApi, client: Client) -> None:
    api.script = [error(405, "method not allowed", "method_not_allowed")]
    with pytest.raises(SftqError) as info:
        client.list_jobs()
    assert type(info.value) is SftqError and info.value.status == 405


def test_error_without_json_envelope(api: FakeJobsApi, client: Client) -> None:
    api.script = [httpx.Response(502, text="<html>Bad Gateway</html>")] * 4
    with pytest.raises(ServerError) as info:
        client.list_jobs()
    assert str(info.value) == "HTTP 502 Bad Gateway (502)"
    assert info.value.body == "<html>Bad Gateway</html>"


def test_unexpected_success_body_is_an_sftq_error(api: FakeJobsApi, client: Client) -> None:
    api.script = [httpx.Response(200, json={"hello": "world"})]
    with pytest.raises(SftqError, match="unexpected response from GET /jobs/x"):
        client.get("x")


def test_api_key_never_appears_in_errors_or_reprs(api: FakeJobsApi) -> None:
    # A careless server (or proxy) echoing the Authorization header must not leak it further.
    api.script = [error(401, f"bad token Bearer {API_KEY}", "unauthorized", details=[API_KEY])]
    with Client(API_KEY, BASE_URL, transport=api.transport()) as c:
        with pytest.raises(Unauthorized) as info:
            c.list_jobs()
        texts = [str(info.value), repr(info.value), repr(info.value.body), repr(c)]
        api.script = [httpx.ConnectError("refused")] * 4
        with pytest.raises(APIConnectionError) as conn:
            c.list_jobs()
        texts += [str(conn.value), repr(conn.value)]
    assert all(API_KEY not in t for t in texts), texts
    assert "sftq_***" in str(info.value)


def test_job_ids_are_path_quoted(api: FakeJobsApi, client: Client) -> None:
    with pytest.raises(NotFound):
        client.get("../analytics/summary")
    assert api.requests[0].url.raw_path.endswith(b"/jobs/..%2Fanalytics%2Fsummary")
    with pytest.raises(ValueError):
        client.get("  ")


# ---- reading jobs -------------------------------------------------------------------------------


def test_get_parses_a_job(api: FakeJobsApi, client: Client) -> None:
    raw = api.add_job(
        "FAIL",
        kind="RFT",
        display_name="math",
        error="Fireworks 400: evaluator missing",
        started_at="2026-05-01T10:01:30Z",
        completed_at="2026-05-01T10:01:31.5Z",
        fireworks_job_name="accounts/trilogy/reinforcementFineTuningJobs/x",
        some_future_field={"ignored": True},
    )
    job = client.get(raw["id"])
    assert isinstance(job, Job) and job.is_terminal
    assert (job.kind, job.state, job.display_name) == ("RFT", "FAIL", "math")
    assert job.completed_at == datetime(2026, 5, 1, 10, 1, 31, 500000, tzinfo=UTC)
    assert job.created_at.tzinfo is not None
    assert not hasattr(job, "some_future_field")


def test_list_jobs_passes_filters_and_reads_the_cursor(api: FakeJobsApi, client: Client) -> None:
    for _ in range(3):
        api.add_job("QUEUED", kind="DPO")
    api.add_job("SUCCESS", kind="DPO")
    page = client.list_jobs(state="QUEUED", kind="DPO", limit=2)
    assert len(page.items) == 2 and page.next_cursor == "2" and page.has_more
    assert dict(api.requests[0].url.params) == {"state": "QUEUED", "kind": "DPO", "limit": "2"}
    last = client.list_jobs(state="QUEUED", kind="DPO", limit=2, cursor=page.next_cursor)
    assert len(last.items) == 1 and last.next_cursor is None and not last.has_more
    assert api.requests[1].url.params["cursor"] == "2"


def test_list_jobs_without_arguments_sends_no_query(api: FakeJobsApi, client: Client) -> None:
    client.list_jobs()
    assert api.requests[0].url.query == b""


def test_list_jobs_falls_back_to_the_link_header(api: FakeJobsApi, client: Client) -> None:
    api.page_header = "link-only"
    for _ in range(3):
        api.add_job()
    page = client.list_jobs(limit=2)
    assert page.next_cursor == "2"


def test_iter_jobs_follows_every_page_newest_first(api: FakeJobsApi, client: Client) -> None:
    created = [api.add_job(kind="SFT")["id"] for _ in range(7)]
    api.add_job(kind="DPO")
    ids = [j.id for j in client.iter_jobs(kind="SFT", page_size=3)]
    assert ids == list(reversed(created))
    assert len(api.requests) == 3
    assert all(r.url.params["kind"] == "SFT" and r.url.params["limit"] == "3" for r in api.requests)


def test_iter_jobs_is_lazy(api: FakeJobsApi, client: Client) -> None:
    for _ in range(5):
        api.add_job()
    it = client.iter_jobs(page_size=2)
    next(it)
    next(it)
    assert len(api.requests) == 1


def test_iter_jobs_stops_on_a_repeated_cursor(api: FakeJobsApi, client: Client) -> None:
    job = api.add_job()
    stuck = httpx.Response(200, json=[job], headers={"X-Next-Cursor": "same"})
    api.script = [stuck, stuck, stuck]
    assert len(list(client.iter_jobs())) == 2


# ---- cancel -------------------------------------------------------------------------------------


def test_cancel_queued_job(api: FakeJobsApi, client: Client) -> None:
    result = client.cancel(api.add_job("QUEUED")["id"])
    assert isinstance(result, CancelResult)
    assert result.state == "CANCELLED" and not result.pending and result.message is None


def test_cancel_running_job_is_pending(api: FakeJobsApi, client: Client) -> None:
    result = client.cancel(api.add_job("PROGRESS")["id"])
    assert result.pending and result.state == "PROGRESS"
    assert result.message is not None and "next tick" in result.message


def test_cancel_terminal_job_conflicts(api: FakeJobsApi, client: Client) -> None:
    with pytest.raises(Conflict) as info:
        client.cancel(api.add_job("SUCCESS")["id"])
    assert info.value.code == "job_terminal"


def test_cancel_whose_first_answer_was_lost(api: FakeJobsApi, client: Client) -> None:
    # The DELETE lands, its response is lost, the retry is told 409: that is our own success.
    job = api.add_job("QUEUED")

    def land_then_fail(request: httpx.Request) -> httpx.Response:
        api.route(request)
        raise httpx.ReadError("connection dropped")

    api.script = [land_then_fail]
    result = client.cancel(job["id"])
    assert result.state == "CANCELLED" and not result.pending
    assert [r.method for r in api.requests] == ["DELETE", "DELETE", "GET"]


def test_retried_cancel_of_a_job_that_finished_otherwise_still_conflicts(
    api: FakeJobsApi, client: Client
) -> None:
    job = api.add_job("SUCCESS")
    api.script = [httpx.Response(502)]
    with pytest.raises(Conflict) as info:
        client.cancel(job["id"])
    assert info.value.attempts == 2


def test_cancel_unknown_job(client: Client) -> None:
    with pytest.raises(NotFound):
        client.cancel(str(uuid.uuid4()))


# ---- wait ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("final", ["SUCCESS", "FAIL", "CANCELLED"])
def test_wait_returns_at_each_terminal_state(api: FakeJobsApi, client: Client, final: str) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED", "PROGRESS", final, "SUCCESS"]
    seen: list[str] = []
    result = client.wait(job["id"], on_progress=lambda j: seen.append(j.state))
    assert result.state == final
    assert seen == ["QUEUED", "PROGRESS", final]


def test_wait_calls_on_progress_on_every_poll(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED"] * 3 + ["PROGRESS"] * 6 + ["SUCCESS"]
    seen: list[Job] = []
    client.wait(job["id"], poll_interval=2, max_interval=10, on_progress=seen.append)
    assert len(seen) == 10
    # Back off while nothing changes; start over from poll_interval when the state moves.
    assert clock.sleeps == [2, 3, 4.5, 2, 3, 4.5, 6.75, 10, 10]


def test_wait_already_terminal_does_not_sleep(
    api: FakeJobsApi, client: Client, clock: FakeClock
) -> None:
    job = api.add_job("SUCCESS")
    assert client.wait(job["id"]).state == "SUCCESS"
    assert clock.sleeps == [] and len(api.requests) == 1


def test_wait_timeout(api: FakeJobsApi, client: Client, clock: FakeClock) -> None:
    job = api.add_job("PROGRESS")
    with pytest.raises(WaitTimeout) as info:
        client.wait(job["id"], poll_interval=4, timeout=10)
    assert info.value.job.state == "PROGRESS" and info.value.timeout == 10
    # The last sleep is cut short so the final poll lands exactly at the deadline.
    assert clock.sleeps == [4, 6]
    assert len(api.requests) == 3
    assert isinstance(info.value, TimeoutError)


def test_wait_survives_transient_errors(api: FakeJobsApi, client: Client) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["PROGRESS", "SUCCESS"]
    api.script = [httpx.Response(503), httpx.ConnectError("blip")]
    # Request 1 gets the 503, request 2 PROGRESS, request 3 the reset, request 4 SUCCESS.
    assert client.wait(job["id"]).state == "SUCCESS"
    assert len(api.requests) == 4


def test_wait_unknown_job(client: Client) -> None:
    with pytest.raises(NotFound):
        client.wait("missing")


def test_wait_rejects_bad_intervals(client: Client) -> None:
    with pytest.raises(ValueError):
        client.wait("x", poll_interval=0)
    with pytest.raises(ValueError):
        client.wait("x", poll_interval=10, max_interval=5)


# ---- analytics and health -----------------------------------------------------------------------


def test_queue_context(api: FakeJobsApi, client: Client) -> None:
    q = client.queue_context()
    assert q.your_progress_job is not None and q.your_progress_job.kind == "SFT"
    assert q.your_progress_job.started_at == datetime(2026, 5, 1, 10, 1, 30, tzinfo=UTC)
    assert [j.queue_position for j in q.your_queued_jobs] == [2]
    assert (q.global_queue_depth, q.global_progress_count, q.global_gpu_in_use) == (5, 2, 8)
    assert str(api.requests[0].url) == f"{BASE_URL}/jobs/analytics/queue"


def test_queue_context_when_idle(api: FakeJobsApi, client: Client) -> None:
    api.script = [
        httpx.Response(
            200,
            json={
                "your_progress_job": None,
                "your_queued_jobs": [],
                "global_queue_depth": 0,
                "global_progress_count": 0,
                "global_gpu_in_use": 0,
            },
        )
    ]
    q = client.queue_context()
    assert q.your_progress_job is None and q.your_queued_jobs == []


def test_summary(client: Client) -> None:
    s = client.summary()
    assert s.total == 47 and s.by_state["SUCCESS"] == 40 and s.by_kind["RFT"] == 2
    assert s.success_rate == pytest.approx(0.909)
    assert s.avg_run_duration_seconds == 3720 and s.total_gpu_hours == 413.5
    assert s.recent_failures[0].failed_at is not None


def test_summary_with_no_history(api: FakeJobsApi, client: Client) -> None:
    api.script = [
        httpx.Response(
            200,
            json={
                "total": 0,
                "by_state": {},
                "by_kind": {},
                "success_rate": None,
                "avg_run_duration_seconds": None,
                "total_gpu_hours": None,
                "recent_failures": [],
            },
        )
    ]
    s = client.summary()
    assert s.success_rate is None and s.avg_run_duration_seconds is None
    assert s.total_gpu_hours == 0.0


def test_job_analytics(api: FakeJobsApi, client: Client) -> None:
    job = api.add_job("SUCCESS")
    a = client.job_analytics(job["id"])
    assert a.id == job["id"] and a.timeline.completed_at is not None
    assert (a.queue_wait_seconds, a.run_duration_seconds, a.gpu_hours) == (90, 3765, 4.183)
    assert str(api.requests[0].url) == f"{BASE_URL}/jobs/{job['id']}/analytics"
    with pytest.raises(NotFound):
        client.job_analytics("nope")


def test_health(client: Client) -> None:
    assert client.health() == {"status": "ok", "database": "ok"}


# ---- first-hour fixes: case, settings, base URL, id prefixes ------------------------------------


def test_states_and_kinds_are_case_insensitive(api: FakeJobsApi, client: Client) -> None:
    queued = api.add_job("QUEUED", kind="DPO")
    api.add_job("FAIL", kind="DPO")
    page = client.list_jobs(state="queued", kind="dpo")
    assert [j.id for j in page.items] == [queued["id"]]
    assert dict(api.requests[-1].url.params) == {"state": "QUEUED", "kind": "DPO"}
    assert [j.id for j in client.iter_jobs(state="Queued")] == [queued["id"]]
    submitted = client.submit("sft", {"dataset": "d"})
    assert submitted.kind == "SFT" and json.loads(api.requests[-1].content)["kind"] == "SFT"


def test_every_missing_setting_is_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as info:
        Client()
    message = str(info.value)
    assert "API key: pass api_key= or SFTQ_API_KEY" in message
    assert "API URL: pass base_url= or SFTQ_API_URL or SUPABASE_URL" in message
    assert [m.what for m in info.value.missing] == ["API key", "API URL"]
    assert [m.ways("cli") for m in info.value.missing][0] == "--api-key or SFTQ_API_KEY"


@pytest.mark.parametrize(
    ("base", "suggested"),
    [
        ("https://sftq.test", "https://sftq.test/functions/v1/jobs-api"),
        ("https://sftq.test/functions/v1", "https://sftq.test/functions/v1/jobs-api"),
        ("https://sftq.test/elsewhere", None),
    ],
)
def test_a_base_url_that_is_not_the_jobs_api_is_named(
    api: FakeJobsApi, base: str, suggested: str | None
) -> None:
    # A Supabase project's root answers 404 to every job route, and to /health: not "no such
    # job" but a configuration error that shows the expected form.
    job = api.add_job()
    with Client(API_KEY, base, transport=api.transport()) as c:
        for call in (lambda: c.get(job["id"]), c.list_jobs, lambda: c.resolve_job_id("0f6c1c9e")):
            with pytest.raises(ConfigurationError) as info:
                call()
            message = str(info.value)
            assert base in message and ".../functions/v1/jobs-api" in message
            if suggested:
                assert f"did you mean {suggested}?" in message
    first, probe = api.requests[:2]
    assert first.url.path.endswith(f"/jobs/{job['id']}") and probe.url.path.endswith("/health")


def test_a_404_from_the_jobs_api_stays_not_found_and_is_checked_once(
    api: FakeJobsApi, client: Client
) -> None:
    for _ in range(3):
        with pytest.raises(NotFound):
            client.get("0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    assert [r.url.path.rsplit("/", 1)[-1] for r in api.requests].count("health") == 1


def test_resolve_job_id(api: FakeJobsApi, client: Client) -> None:
    job = api.add_job(id="0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    api.jobs[job["id"]] = job
    api.add_job(id="0f6c1c9e-ffff-4c3d-8e4f-0123456789ab")
    # A full id needs no request.
    assert client.resolve_job_id(job["id"].upper()) == job["id"].upper()
    assert api.requests == []
    for prefix in ("0f6c1c9e-1a", "0f6c1c9e1a2b", " 0F6C1C9E-1A2B "):
        assert client.resolve_job_id(prefix) == job["id"]
    assert api.requests[0].url.params["id_prefix"] == "0f6c1c9e1a"
    with pytest.raises(AmbiguousJobId) as info:
        client.resolve_job_id("0f6c1c9e")
    assert len(info.value.candidates) == 2
    with pytest.raises(NotFound, match="no job of yours has an id starting with 12345678"):
        client.resolve_job_id("12345678")
    with pytest.raises(ValueError, match="at least its first 8 characters"):
        client.resolve_job_id("0f6c1c9")
