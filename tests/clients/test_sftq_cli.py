"""The `sftq` CLI: main([...]) with the client factory pointed at the in-memory jobs-api."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_jobs_api import API_KEY, BASE_URL, FakeJobsApi, error

from sftq_client import Client, cli

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def sftq(
    api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Run:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("SFTQ_API_KEY", API_KEY)
    monkeypatch.setenv("SFTQ_API_URL", BASE_URL)

    def factory(api_key: str | None, api_url: str | None) -> Client:
        return Client(api_key, api_url, transport=api.transport())

    monkeypatch.setattr(cli, "client_factory", factory)

    def run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        assert API_KEY not in out + err
        return code, out, err

    return run


@pytest.fixture
def payload_file(tmp_path: Path) -> Path:
    path = tmp_path / "payload.json"
    path.write_text(json.dumps({"baseModel": "m", "dataset": "d", "epochs": 1}))
    return path


# ---- submit -------------------------------------------------------------------------------------


def test_submit(sftq: Run, api: FakeJobsApi, payload_file: Path) -> None:
    code, out, err = sftq(
        "submit", "--kind", "sft", "--payload", str(payload_file), "--display-name", "base",
        "--gpu-count", "8",
    )  # fmt: skip
    assert code == 0, err
    (job_id,) = api.jobs
    assert f"queued {job_id} (SFT)" in out and f"sftq wait {job_id}" in out
    assert json.loads(api.requests[0].content) == {
        "kind": "SFT",
        "fireworks_payload": {"baseModel": "m", "dataset": "d", "epochs": 1},
        "display_name": "base",
        "gpu_count": 8,
    }


def test_submit_after_is_repeatable_and_max_run_takes_a_duration(
        sftq: Run, api: FakeJobsApi, payload_file: Path) -> None:
    code, out, err = sftq(
        "submit", "--kind", "dpo", "--payload", str(payload_file), "--after", "0123abcd",
        "--after", "4567cdef", "--max-run", "12h",
    )  # fmt: skip
    assert code == 0, err
    body = json.loads(api.requests[0].content)
    assert body["after"] == ["0123abcd", "4567cdef"] and body["max_run_seconds"] == 43200
    code, _, err = sftq("submit", "--kind", "dpo", "--payload", str(payload_file),
                        "--max-run", "30s")
    assert code == 2 and "60 seconds to 30 days" in err


@pytest.mark.parametrize(
    ("name", "kind"),
    [("sft.json", "SFT"), ("DPO.json", "DPO"), ("rft", "RFT"), ("dpo-run.json", "DPO"),
     ("my_rft.json", "RFT"), ("sft_v2.payload.json", "SFT"), ("week-3-SFT.json", "SFT"),
     ("sft-then-sft.json", "SFT")],
)  # fmt: skip
def test_submit_takes_the_kind_from_the_file_name(
    sftq: Run, api: FakeJobsApi, tmp_path: Path, name: str, kind: str
) -> None:
    # Issue 18.8: `sftq submit --payload examples/sft.json` works as written.
    path = tmp_path / name
    path.write_text('{"dataset": "d"}')
    code, out, err = sftq("submit", "--payload", str(path))
    assert code == 0, err
    assert json.loads(api.requests[0].content)["kind"] == kind
    assert f"({kind})" in out


def test_an_explicit_kind_wins_over_the_file_name(
    sftq: Run, api: FakeJobsApi, tmp_path: Path
) -> None:
    path = tmp_path / "sft.json"
    path.write_text('{"dataset": "d"}')
    code, _, err = sftq("submit", "--kind", "dpo", "--payload", str(path))
    assert code == 0, err
    assert json.loads(api.requests[0].content)["kind"] == "DPO"


@pytest.mark.parametrize(
    "name", ["payload.json", "sftx.json", "mysft.json", "sft-to-dpo.json", "dpo.sft.json", "-"]
)
def test_submit_without_a_kind_the_name_does_not_tell(
    sftq: Run, api: FakeJobsApi, tmp_path: Path, name: str
) -> None:
    path = "-" if name == "-" else str(tmp_path / name)
    if name != "-":
        Path(path).write_text('{"dataset": "d"}')
    code, out, err = sftq("submit", "--payload", path, stdin='{"dataset": "d"}')
    assert (code, out) == (2, "")
    assert "--kind SFT|DPO|RFT is required (it could not be told from the file name)" in err
    assert api.requests == []


def test_submit_json_from_stdin(sftq: Run, api: FakeJobsApi) -> None:
    code, out, _ = sftq(
        "submit", "--kind", "DPO", "--payload", "-", "--json", stdin='{"dataset": "d"}'
    )
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"id", "kind", "state", "created_at"}
    assert data["state"] == "QUEUED" and data["created_at"].endswith("Z")
    assert json.loads(api.requests[0].content)["fireworks_payload"] == {"dataset": "d"}


def test_submit_idempotency_key_flag(sftq: Run, api: FakeJobsApi, payload_file: Path) -> None:
    for _ in range(2):
        code, _, _ = sftq(
            "submit", "--kind", "SFT", "--payload", str(payload_file), "--idempotency-key", "k1"
        )
        assert code == 0
    assert len(api.jobs) == 1


def test_submit_detects_a_whole_envelope(sftq: Run, api: FakeJobsApi, tmp_path: Path) -> None:
    path = tmp_path / "envelope.json"
    path.write_text(json.dumps({"kind": "SFT", "fireworks_payload": {"dataset": "d"}}))
    code, out, err = sftq("submit", "--kind", "SFT", "--payload", str(path))
    assert code == 2 and out == ""
    assert "whole request body" in err and "jq .fireworks_payload" in err
    assert api.requests == []


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must hold a JSON object")],
)
def test_submit_bad_payload_file(
    sftq: Run, api: FakeJobsApi, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "p.json"
    path.write_text(content)
    code, _, err = sftq("submit", "--kind", "SFT", "--payload", str(path))
    assert code == 2 and message in err and api.requests == []


def test_submit_missing_payload_file(sftq: Run, tmp_path: Path) -> None:
    code, _, err = sftq("submit", "--kind", "SFT", "--payload", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read payload file" in err


def test_submit_server_error_message_format(
    sftq: Run, api: FakeJobsApi, payload_file: Path
) -> None:
    api.script = [error(400, "fireworks_payload is required", "missing_payload")]
    code, out, err = sftq("submit", "--kind", "SFT", "--payload", str(payload_file))
    assert code == 7 and out == ""
    assert err.splitlines()[0] == "error: fireworks_payload is required (400 missing_payload)"


def test_submit_validation_details_are_shown(
    sftq: Run, api: FakeJobsApi, payload_file: Path
) -> None:
    api.script = [
        error(400, "invalid request", "validation_error", details=[{"loc": ["gpu_count"]}])
    ]
    code, _, err = sftq("submit", "--kind", "SFT", "--payload", str(payload_file))
    assert code == 7 and 'details: [{"loc": ["gpu_count"]}]' in err


@pytest.mark.parametrize(("final", "expected"), [("SUCCESS", 0), ("FAIL", 10), ("CANCELLED", 11)])
def test_submit_and_wait(
    sftq: Run,
    api: FakeJobsApi,
    payload_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    final: str,
    expected: int,
) -> None:
    original = api.add_job

    def add_job(*args: Any, **kwargs: Any) -> dict[str, Any]:
        job = original(*args, **kwargs)
        api.state_plan[job["id"]] = ["QUEUED", "PROGRESS", final]
        return job

    monkeypatch.setattr(api, "add_job", add_job)
    code, out, err = sftq("submit", "--kind", "SFT", "--payload", str(payload_file), "--wait")
    assert code == expected
    (job_id,) = api.jobs
    assert f"queued {job_id}" in err and "state:" in out and final in out


# ---- list / get ---------------------------------------------------------------------------------


def test_list_table_wide(sftq: Run, api: FakeJobsApi) -> None:
    a = api.add_job("SUCCESS", display_name="first run", started_at="2026-05-01T10:00:05Z")
    b = api.add_job("QUEUED", kind="DPO")
    code, out, err = sftq("list", "--wide")
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = ["ID", "KIND", "STATE", "GPUS", "CREATED", "STARTED", "COMPLETED", "NAME"]
    assert lines[0].split() == header
    assert lines[1].startswith(b["id"]) and lines[2].startswith(a["id"])
    assert "first run" in lines[2] and "2026-05-01 10:00:05Z" in lines[2]
    # Plain aligned columns: every row starts its STATE column at the same offset.
    offsets = {
        line.index(state) for line, state in zip(lines[1:], ["QUEUED", "SUCCESS"], strict=True)
    }
    assert len(offsets) == 1


def test_list_json_and_filters(sftq: Run, api: FakeJobsApi) -> None:
    api.add_job("QUEUED", kind="SFT")
    target = api.add_job("PROGRESS", kind="RFT")
    code, out, _ = sftq("list", "--state", "progress", "--kind", "RFT", "--json")
    assert code == 0
    data = json.loads(out)
    assert [j["id"] for j in data] == [target["id"]]
    assert set(data[0]) == {
        "id", "kind", "state", "display_name", "gpu_count", "created_at", "started_at",
        "completed_at", "error", "fireworks_job_name",
        "failure_class", "retry_of",  # added since the contract (issue 10)
        "warnings", "estimated_cost",  # and by the pre-flight (issue 44)
        "after", "max_run_seconds", "stalled", "stalled_since",  # and issue 53
    }  # fmt: skip
    # A plain list is one page of the newest jobs (GET /jobs without limit would be all).
    assert dict(api.requests[0].url.params) == {"state": "PROGRESS", "kind": "RFT", "limit": "100"}


def test_list_says_when_more_exist(sftq: Run, api: FakeJobsApi) -> None:
    for _ in range(101):
        api.add_job()
    code, out, err = sftq("list")
    assert code == 0 and len(out.splitlines()) == 101
    assert "more exist" in err and "--all" in err


def test_list_all_follows_pages(sftq: Run, api: FakeJobsApi) -> None:
    for _ in range(1203):
        api.add_job()
    code, out, err = sftq("list", "--all", "--json")
    assert code == 0 and err == ""
    assert len(json.loads(out)) == 1203
    assert len(api.requests) == 3


def test_list_limit_caps_the_total(sftq: Run, api: FakeJobsApi) -> None:
    for _ in range(30):
        api.add_job()
    code, out, _ = sftq("list", "--limit", "25", "--json")
    assert code == 0 and len(json.loads(out)) == 25
    assert api.requests[0].url.params["limit"] == "25" and len(api.requests) == 1


def test_list_empty(sftq: Run) -> None:
    assert sftq("list")[:2] == (0, "no jobs\n")
    assert json.loads(sftq("list", "--json")[1]) == []


def test_list_all_and_limit_are_exclusive(sftq: Run) -> None:
    code, _, err = sftq("list", "--all", "--limit", "3")
    assert code == 2 and "not allowed with" in err


def test_get(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("FAIL", error="Fireworks 400: bad dataset")
    code, out, _ = sftq("get", job["id"])
    assert code == 0
    assert f"id:                  {job['id']}" in out
    assert "error:               Fireworks 400: bad dataset" in out
    code, out, _ = sftq("get", job["id"], "--json")
    assert json.loads(out)["error"] == "Fireworks 400: bad dataset"


def test_get_shows_failure_class_and_retry_of_when_set(sftq: Run, api: FakeJobsApi) -> None:
    # docs/cli.md: `sftq get ID` shows whether a FAIL is worth a retry, and what a job retries.
    failed = api.add_job("FAIL", error="gave up", failure_class="retryable", retry_of=None)
    retry = api.add_job(retry_of=failed["id"], failure_class=None)
    code, out, _ = sftq("get", failed["id"])
    assert code == 0
    assert "failure_class:       retryable\n" in out and "retry_of" not in out
    code, out, _ = sftq("get", retry["id"])
    assert code == 0
    assert f"retry_of:            {failed['id']}\n" in out and "failure_class" not in out
    # A job with neither shows neither.
    code, out, _ = sftq("get", api.add_job()["id"])
    assert code == 0 and "failure_class" not in out and "retry_of" not in out


def test_get_shows_warnings_cost_and_the_estimate_with_its_basis(sftq: Run,
                                                                  api: FakeJobsApi) -> None:
    """Issue 54 items 6, 9, 16: `sftq get` shows the pre-flight's warnings, the cost in
    dollars, and for a waiting job why it waits and when it should start, with the basis."""
    job = api.add_job(
        "QUEUED",
        warnings=[{"path": "fireworks_payload.loraRnk", "message": "unknown field 'loraRnk'"},
                  {"path": "fireworks_payload.x", "message": "unknown field 'x'"}],
        estimated_cost={"nanos": 166666667, "units": "0", "currencyCode": "USD"})
    api.analytics_extra[job["id"]] = {
        "queue_position": 0,
        "waiting_reason": {"code": "behind_own_running_job", "message": "You have 1 running job"},
        "estimated_start_at": "2026-05-01T11:00:00Z",
        "estimate": {"basis": "default run time of 60 minutes: no SFT job on a similar GPU "
                              "count finished in the last 30 days"}}
    code, out, _ = sftq("get", job["id"])
    assert code == 0
    assert "warnings:            fireworks_payload.loraRnk: unknown field 'loraRnk'\n" \
           "                     fireworks_payload.x: unknown field 'x'\n" in out
    assert "estimated_cost:      $0.17 (Fireworks' estimate)\n" in out
    assert "nanos" not in out
    assert "waiting_reason:      You have 1 running job\n" in out
    assert "queue_position:      0 of other users' jobs ahead\n" in out
    assert ("estimated_start_at:  2026-05-01 11:00:00Z (estimate: assumes a run of 60 minutes: "
            "no similar job finished lately)\n") in out
    # A running job: the finish estimate with its basis.
    running = api.add_job("PROGRESS")
    api.analytics_extra[running["id"]] = {
        "provider_state": "JOB_STATE_RUNNING", "progress": {"percent": 40, "epoch": 1},
        "estimated_finish_at": "2026-05-01T12:00:00Z",
        "estimate": {"basis": "median run time of 3 SFT jobs on 3-4 GPUs that finished in the "
                              "last 30 days"}}
    code, out, _ = sftq("get", running["id"])
    assert "progress:             40%\n" in out
    assert "estimated_finish_at:  2026-05-01 12:00:00Z (estimate: median of 3 similar runs)" in out


@pytest.mark.parametrize(("money", "text"), [
    ({"nanos": 166666667, "units": "0", "currencyCode": "USD"}, "$0.17"),
    ({"units": "12", "nanos": 500000000, "currencyCode": "EUR"}, "12.50 EUR"),
    ({"units": "0", "nanos": 1000000, "currencyCode": "USD"}, "< $0.01"),
    ({"units": "3"}, "$3.00"),
    ({"units": "x"}, "-"),
])  # fmt: skip
def test_money_reads_as_money(money: dict[str, Any], text: str) -> None:
    from sftq_client.cli._common import fmt_money

    assert fmt_money(money) == text


def test_get_not_found(sftq: Run) -> None:
    code, out, err = sftq("get", "0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    assert (code, out) == (4, "")
    assert err == "error: job not found (404 not_found)\n"


# ---- cancel -------------------------------------------------------------------------------------


def test_cancel_queued(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job()
    assert sftq("cancel", job["id"])[:2] == (0, f"cancelled {job['id']}\n")


def test_cancel_running_is_pending(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("PROGRESS")
    code, out, _ = sftq("cancel", job["id"])
    assert code == 0 and "cancel requested" in out and "next tick" in out
    code, out, _ = sftq("cancel", job["id"], "--json")
    data = json.loads(out)
    assert data["pending"] is True and data["state"] == "PROGRESS" and data["message"]


def test_cancel_terminal_conflicts(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("SUCCESS")
    code, _, err = sftq("cancel", job["id"])
    assert code == 5 and err == "error: job is already SUCCESS (409 job_terminal)\n"


# ---- wait ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("final", "expected"), [("SUCCESS", 0), ("FAIL", 10), ("CANCELLED", 11)])
def test_wait_exit_codes_and_state_lines(
    sftq: Run, api: FakeJobsApi, final: str, expected: int
) -> None:
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED", "QUEUED", "PROGRESS", "PROGRESS", final]
    code, out, err = sftq("wait", job["id"], "--interval", "1")
    assert code == expected
    # Not a terminal: one line per state change, not per poll.
    states = [line.split()[-1] for line in err.splitlines()]
    assert states == ["QUEUED", "PROGRESS", final]
    assert all(line.split()[1] == job["id"] for line in err.splitlines())
    assert f"state:               {final}" in out


def test_wait_json(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("SUCCESS")
    code, out, _ = sftq("wait", job["id"], "--json")
    assert code == 0 and json.loads(out)["state"] == "SUCCESS"


def test_wait_on_a_tty_rewrites_one_status_line(
    sftq: Run, api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: True)
    job = api.add_job()
    api.state_plan[job["id"]] = ["QUEUED", "PROGRESS", "SUCCESS"]
    code, _, err = sftq("wait", job["id"])
    assert code == 0
    assert err.count("\r\x1b[K") == 3 and err.endswith("\n") and err.count("\n") == 1
    assert f"{job['id']}  SUCCESS" in err


def test_wait_timeout(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("PROGRESS")
    code, out, err = sftq("wait", job["id"], "--interval", "2", "--timeout", "5")
    assert code == 12 and out == ""
    assert f"error: job {job['id']} is still PROGRESS after waiting 5s" in err


def test_wait_not_found(sftq: Run) -> None:
    assert sftq("wait", "missing")[0] == 4


def test_wait_rejects_a_bad_interval(sftq: Run) -> None:
    code, _, err = sftq("wait", "x", "--interval", "0")
    assert code == 2 and "--interval" in err


# ---- analytics ----------------------------------------------------------------------------------


def test_analytics_queue(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = sftq("analytics", "queue")  # an older server: no reasons, no estimates
    assert code == 0 and out.splitlines()[3].endswith("dpo follow-up  -      -")
    import fake_jobs_api

    queued = {**fake_jobs_api.QUEUE_BODY["your_queued_jobs"][0],
              "waiting_reason": {"code": "behind_own_running_job",
                                 "message": "You have 1 running job and may run 1 at a time: "
                                            "this job is admitted when one of them ends."},
              "estimated_start_at": "2026-05-01T11:01:30Z",
              "estimate": {"basis": "simulated strict-FIFO admission with 2 jobs ahead, 1 "
                                    "running and 12 free GPUs; run times from the provider's "
                                    "progress or recent similar jobs, else a default of 60 "
                                    "minutes"}}
    monkeypatch.setattr(fake_jobs_api, "QUEUE_BODY",
                        {**fake_jobs_api.QUEUE_BODY, "your_queued_jobs": [queued]})
    code, out, _ = sftq("analytics", "queue")
    assert code == 0
    # Beside AHEAD (other users' jobs only), why the job waits and when it should start, and
    # what the estimates rest on (issue 54 items 9, 10).
    header, row = out.splitlines()[2:4]
    assert header.split() == ["ID", "KIND", "GPUS", "CREATED", "AHEAD", "NAME", "START", "WHY"]
    assert row.endswith("05-01 11:01Z  You have 1 running job and may run 1 at a time: this job "
                        "is admitted when one of them ends."), row
    assert ("estimates: simulated queue, 2 ahead; a run with no history counts 60 minutes\n"
            in out)
    assert "running: 11111111-1111-4111-8111-111111111111  SFT  4 GPUs" in out
    assert "queued (1):" in out and "dpo follow-up" in out
    assert "everyone: 5 queued, 2 running, 8 GPUs in use" in out
    data = json.loads(sftq("analytics", "queue", "--json")[1])
    assert data["your_queued_jobs"][0]["queue_position"] == 2


def test_analytics_summary(sftq: Run) -> None:
    code, out, _ = sftq("analytics", "summary")
    assert code == 0
    assert "success rate:  90.9%" in out and "avg run:       1h02m00s" in out
    # A multi-line provider error is flattened so the table stays one row per failure.
    assert "Fireworks said: learningRate must be positive" in out
    data = json.loads(sftq("analytics", "summary", "--json")[1])
    assert data["total"] == 47 and data["by_kind"] == {"SFT": 30, "DPO": 15, "RFT": 2}


def test_analytics_job(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("SUCCESS")
    code, out, _ = sftq("analytics", "job", job["id"])
    assert code == 0
    assert "queue_wait:          1m30s" in out and "run_duration:        1h02m45s" in out
    assert "gpu_hours:           4.183" in out
    data = json.loads(sftq("analytics", "job", job["id"], "--json")[1])
    assert data["timeline"]["queued_at"] == "2026-05-01T10:00:00Z"
    assert sftq("analytics", "job", "missing")[0] == 4


def test_analytics_needs_a_view(sftq: Run) -> None:
    assert sftq("analytics")[0] == 2


# ---- errors, configuration, exit codes ----------------------------------------------------------


def test_unauthorized(sftq: Run, api: FakeJobsApi) -> None:
    code, _, err = sftq("list", "--api-key", "sftq_wrong")
    assert code == 3
    assert err.splitlines() == [
        "error: invalid or missing API key (401 unauthorized)",
        "hint: check SFTQ_API_KEY (or --api-key); keys start with sftq_",
    ]
    assert "sftq_wrong" not in err


def test_connection_options_before_or_after_the_command(sftq: Run, api: FakeJobsApi) -> None:
    other = "https://other.test/functions/v1/jobs-api"
    sftq("--api-url", other, "list")
    sftq("list", "--api-url", other)
    sftq("--api-key", "sftq_a", "analytics", "summary", "--api-key", API_KEY)
    assert [r.url.host for r in api.requests[:2]] == ["other.test", "other.test"]
    assert api.requests[2].headers["authorization"] == f"Bearer {API_KEY}"


def test_unavailable_after_retries(sftq: Run, api: FakeJobsApi) -> None:
    api.script = [error(503, "database unavailable", "unavailable", headers={"Retry-After": "1"})]
    api.script *= 4
    code, _, err = sftq("list")
    assert code == 6
    assert "error: database unavailable (503 unavailable)" in err
    assert "retry after 1s" in err


def test_connection_error(sftq: Run, api: FakeJobsApi) -> None:
    api.script = [httpx.ConnectError("[Errno 111] Connection refused")] * 4
    code, _, err = sftq("get", "0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    assert code == 6 and "could not reach the jobs-api" in err and "Connection refused" in err


def test_internal_error_and_unknown_status(sftq: Run, api: FakeJobsApi) -> None:
    api.script = [error(500, "boom", "internal")] * 4
    assert sftq("list")[0] == 6
    api.script = [error(405, "method not allowed", "method_not_allowed")]
    assert sftq("list")[0] == 1


def test_missing_key(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SFTQ_API_KEY")
    code, _, err = sftq("list")
    assert code == 2 and "API key: --api-key or SFTQ_API_KEY" in err
    assert "API URL" not in err


def test_missing_url(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SFTQ_API_URL")
    code, _, err = sftq("list")
    assert code == 2 and "SUPABASE_URL" in err


def test_usage_errors(sftq: Run) -> None:
    assert sftq()[0] == 2
    assert sftq("submit", "--kind", "XYZ", "--payload", "-")[0] == 2
    assert sftq("get")[0] == 2
    assert sftq("frobnicate")[0] == 2
    assert sftq("list", "--limit", "0")[0] == 2
    code, _, err = sftq("get", " ")
    assert code == 2 and err == "error: job_id must be a non-empty string\n"


def test_help_lists_user_and_server_commands(sftq: Run) -> None:
    code, out, _ = sftq("--help")
    assert code == 0
    for name in ["submit", "list", "get", "cancel", "wait", "analytics", *cli.SERVER_COMMANDS]:
        assert f"    {name} " in out
    assert "exit codes:" in out and " 12  " in out
    assert sftq("--version")[0] == 0


def test_interrupt(sftq: Run, api: FakeJobsApi) -> None:
    def interrupt(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    api.script = [interrupt]
    code, _, err = sftq("list")
    assert code == 130 and "interrupted" in err


# ---- server subcommands -------------------------------------------------------------------------


def fake_server_cli(
    monkeypatch: pytest.MonkeyPatch, main: Callable[[list[str]], int | None]
) -> None:
    module = types.ModuleType("sftq_server.cli")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sftq_server.cli", module)


def test_server_commands_are_dispatched(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def main(argv: list[str]) -> int:
        calls.append(argv)
        return 9

    fake_server_cli(monkeypatch, main)
    assert sftq("db", "migrate", "--dry-run")[0] == 9
    assert sftq("--api-url", BASE_URL, "tick", "--once")[0] == 9
    assert sftq("admin", "--help")[0] == 9
    assert calls == [["db", "migrate", "--dry-run"], ["tick", "--once"], ["admin", "--help"]]


def test_server_command_returning_none_is_success(
    sftq: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_server_cli(monkeypatch, lambda argv: None)
    assert sftq("dev")[0] == 0


def test_server_command_without_server_extras(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail exactly like a client-only install does.
    monkeypatch.setitem(sys.modules, "sftq_server.cli", None)
    code, out, err = sftq("simulator", "--port", "9000")
    assert code == 2 and out == ""
    assert err.splitlines()[0] == (
        "error: `sftq simulator` needs the server extras: pip install 'finetune-queue[server]'"
    )


def test_server_command_missing_a_lazy_dependency(
    sftq: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    def main(argv: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")

    fake_server_cli(monkeypatch, main)
    code, _, err = sftq("ticker")
    assert code == 2 and "needs the server extras" in err


def test_server_command_bugs_are_not_disguised(sftq: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def main(argv: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'typo'", name="typo")

    fake_server_cli(monkeypatch, main)
    with pytest.raises(ModuleNotFoundError):
        sftq("ticker")


# ---- the installed entry points -----------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("SFTQ_API_KEY", "SFTQ_API_URL", "SUPABASE_URL"):
        env.pop(name, None)
    return env


def test_console_script_exit_code() -> None:
    script = Path(sys.executable).with_name("sftq")
    if not script.exists():
        pytest.skip("the sftq console script is not installed in this environment")
    proc = subprocess.run(
        [str(script), "list"], env=_clean_env(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "API key: --api-key or SFTQ_API_KEY" in proc.stderr


def test_python_dash_m_exit_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sftq_client", "get"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


# ---- first-hour fixes ---------------------------------------------------------------------------


def test_list_fits_100_columns_with_short_ids(sftq: Run, api: FakeJobsApi) -> None:
    long_name = "a rather long display name that someone pasted from a notebook " * 3
    running = api.add_job(
        "PROGRESS", display_name=long_name, started_at="2026-05-01T10:00:05Z", gpu_count=64
    )
    done = api.add_job(
        "CANCELLED",
        kind="RFT",
        display_name="short",
        started_at="2026-05-01T10:00:05Z",
        completed_at="2026-05-01T11:02:05Z",
    )
    code, out, err = sftq("list")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "KIND", "STATE", "GPUS", "CREATED", "RAN", "NAME"]
    assert max(len(line) for line in lines) <= 100, out
    assert lines[1].split()[0] == done["id"][:8] and "1h02m00s" in lines[1]
    assert lines[2].split()[0] == running["id"][:8] and lines[2].endswith("...")
    # --wide keeps everything, full ids included.
    wide = sftq("list", "--wide")[1]
    assert running["id"] in wide and long_name.strip() in wide


def test_short_ids_grow_until_they_tell_jobs_apart(sftq: Run, api: FakeJobsApi) -> None:
    api.add_job(id="0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    api.add_job(id="0f6c1c9e-1a2c-4c3d-8e4f-0123456789ab")
    api.add_job(id="12345678-1a2c-4c3d-8e4f-0123456789ab")
    ids = [line.split()[0] for line in sftq("list")[1].splitlines()[1:]]
    assert sorted(ids) == ["0f6c1c9e-1a2b", "0f6c1c9e-1a2c", "12345678-1a2c"]


def test_commands_take_an_id_prefix(sftq: Run, api: FakeJobsApi) -> None:
    job = api.add_job("QUEUED", id="0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab")
    api.add_job("SUCCESS", id="99999999-1a2b-4c3d-8e4f-0123456789ab")
    code, out, err = sftq("get", "0f6c1c9e")
    assert code == 0 and f"id:                  {job['id']}" in out, err
    assert sftq("analytics", "job", "0f6c1c9e", "--json")[0] == 0
    assert sftq("wait", "9999999", "--timeout", "1")[0] == 2  # 7 characters: too short
    code, out, _ = sftq("wait", "99999999", "--json")
    assert code == 0 and json.loads(out)["state"] == "SUCCESS"
    assert sftq("cancel", "0f6c1c9e-1a")[:2] == (0, f"cancelled {job['id']}\n")
    api.add_event(job["id"], "cancelled", "CANCELLED", "cancelled by its owner")
    code, out, err = sftq("events", "0f6c1c9e")
    assert code == 0 and "cancelled by its owner" in out, err
    assert api.requests[-1].url.path.endswith(f"/jobs/{job['id']}/events")
    # retry takes one too (tests/clients/test_sftq_retry.py, whose fake answers POST .../retry).
    # Each lookup asked for a few candidates of that prefix, never the whole list.
    lookups = [r for r in api.requests if "id_prefix" in r.url.params]
    assert {r.url.params["limit"] for r in lookups} == {"10"}


def test_an_ambiguous_prefix_lists_the_candidates(sftq: Run, api: FakeJobsApi) -> None:
    a = api.add_job(id="0f6c1c9e-1a2b-4c3d-8e4f-0123456789ab", display_name="first")
    b = api.add_job(id="0f6c1c9e-ffff-4c3d-8e4f-0123456789ab", display_name="second")
    code, out, err = sftq("get", "0f6c1c9e")
    assert (code, out) == (2, "")
    assert "0f6c1c9e is the start of 2 of your jobs' ids; give more characters" in err
    assert a["id"] in err and b["id"] in err and "first" in err and "second" in err
    code, _, err = sftq("get", "deadbeef")
    assert code == 4 and "no job of yours has an id starting with deadbeef" in err
    code, _, err = sftq("cancel", "0f6c")
    assert code == 2 and "at least its first 8 characters" in err


def test_every_missing_setting_at_once_in_cli_words(
    sftq: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SFTQ_API_KEY")
    monkeypatch.delenv("SFTQ_API_URL")
    code, out, err = sftq("list")
    assert (code, out) == (2, "")
    assert "API key: --api-key or SFTQ_API_KEY" in err
    assert "API URL: --api-url or SFTQ_API_URL or SUPABASE_URL" in err
    assert "api_key=" not in err and "base_url=" not in err


def test_the_supabase_root_as_api_url_shows_the_expected_form(
    sftq: Run, api: FakeJobsApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = api.add_job()
    monkeypatch.setenv("SFTQ_API_URL", "https://sftq.test")
    for argv in (("get", job["id"]), ("list",), ("cancel", job["id"][:8])):
        code, out, err = sftq(*argv)
        assert (code, out) == (2, ""), err
        assert ".../functions/v1/jobs-api" in err and "no such job" not in err.lower()
        assert "did you mean https://sftq.test/functions/v1/jobs-api?" in err
