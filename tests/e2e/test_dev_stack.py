"""`sftq dev` starts every part, answers, and stops leaving no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import stat
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from conftest import (
    ENV_NAMES,
    SFT_PAYLOAD,
    DevProcess,
    DevStacks,
    alive,
    clean_env,
    cmdline,
    free_port,
    postmaster_pid,
    run_sftq,
    sftq_argv,
    wait_until,
)


def auth(values: dict[str, str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {values['SFTQ_API_KEY']}"}


def tick(http: httpx.Client, values: dict[str, str]) -> None:
    r = http.post(
        f"{values['SUPABASE_URL']}/functions/v1/scheduler-tick",
        headers={"Authorization": f"Bearer {values['SFTQ_TICK_SECRET']}"},
    )
    assert r.status_code == 200, r.text


def get_job(http: httpx.Client, values: dict[str, str], job_id: str) -> dict[str, object]:
    r = http.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id}", headers=auth(values)
    )
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def submit(http: httpx.Client, values: dict[str, str], name: str = "e2e") -> str:
    r = http.post(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs",
        headers=auth(values),
        json={
            "kind": "SFT",
            "display_name": name,
            "gpu_count": 4,
            "fireworks_payload": SFT_PAYLOAD,
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["state"] == "QUEUED"
    job_id: str = r.json()["id"]
    return job_id


def run_flow(http: httpx.Client, values: dict[str, str]) -> str:
    """Submit, tick (admitted), finish at the simulator, tick (SUCCESS), read analytics."""
    job_id = submit(http, values)

    # The tick endpoint wants the secret.
    r = http.post(f"{values['SUPABASE_URL']}/functions/v1/scheduler-tick")
    assert r.status_code == 401, r.text
    tick(http, values)
    job = get_job(http, values, job_id)
    assert job["state"] == "PROGRESS", job
    name = str(job["fireworks_job_name"])
    collection, fw_id = name.split("/")[2], name.split("/")[3]

    r = http.post(
        f"{values['SIMULATOR_URL']}/_sim/jobs/{collection}/{fw_id}:finish",
        json={"state": "JOB_STATE_COMPLETED"},
    )
    assert r.status_code == 200, r.text
    tick(http, values)
    assert get_job(http, values, job_id)["state"] == "SUCCESS"

    r = http.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/analytics/summary",
        headers=auth(values),
    )
    assert r.status_code == 200, r.text
    assert r.json()["by_state"]["SUCCESS"] >= 1
    r = http.get(
        f"{values['SUPABASE_URL']}/functions/v1/jobs-api/jobs/{job_id}/analytics",
        headers=auth(values),
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "SUCCESS"
    return job_id


def assert_all_gone(pids: set[int], data_dir: Path | None = None) -> None:
    wait_until(lambda: not [p for p in pids if alive(p)], 15, f"processes {sorted(pids)} to exit")
    if data_dir is not None:
        assert not (data_dir / "pg" / "pgdata" / "postmaster.pid").exists(), (
            "PostgreSQL still running"
        )


def test_embedded_stack_runs_stops_cleanly_and_restarts_with_its_state(
    stacks: DevStacks, http: httpx.Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # The embedded database's port is kept in pg.port (54329 when free on a first start);
    # a free one here, so this test can run next to a developer's own `sftq dev`.
    pg_port = free_port()
    (data_dir / "pg.port").write_text(f"{pg_port}\n")
    port, sim_port = free_port(), free_port()
    dev = stacks.start(data_dir, port=port, simulator_port=sim_port)
    values = dev.wait_ready()

    # stdout is exactly the KEY=value lines, in order (the documented five first), then ready.
    from sftq_server.dev.envfile import ENV_NAMES as printed

    names = [ln.split("=", 1)[0] for ln in dev.lines[:-1]]
    assert names == list(printed) and names[: len(ENV_NAMES)] == list(ENV_NAMES)
    assert dev.lines[-1] == "ready"
    assert values["SUPABASE_URL"] == f"http://127.0.0.1:{port}"
    assert values["SIMULATOR_URL"] == f"http://127.0.0.1:{sim_port}"
    assert re.fullmatch(
        rf"postgresql://postgres:[0-9a-f]{{48}}@127\.0\.0\.1:{pg_port}/sftq", values["DATABASE_URL"]
    ), values["DATABASE_URL"]
    assert values["SFTQ_API_KEY"].startswith("sftq_")
    assert len(values["SFTQ_TICK_SECRET"]) >= 32

    env_file = data_dir / "env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    file_lines = [ln for ln in env_file.read_text().splitlines() if re.match(r"[A-Z_]+=", ln)]
    assert file_lines == dev.lines[:-1]

    pg_pid = postmaster_pid(data_dir)
    assert pg_pid is not None and alive(pg_pid)
    commands = " | ".join(cmdline(p) for p in dev.track())
    assert "sftq_server.simulator" in commands and "serve" in commands
    assert "ticker" not in commands  # --tick-interval 0

    job_id = run_flow(http, values)

    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
    assert_all_gone(dev.seen_pids | {pg_pid}, data_dir)
    assert "stopped PostgreSQL" in dev.log()

    # Same data dir again: same key, secret and database; the job and the user are still there.
    # From a shell that sourced the env file: its DATABASE_URL is our own embedded database,
    # which must be started again rather than expected to be up.
    again = stacks.start(
        data_dir, port=port, simulator_port=sim_port, database_url=values["DATABASE_URL"]
    )
    values2 = again.wait_ready()
    assert values2 == values
    assert get_job(http, values2, job_id)["state"] == "SUCCESS"
    assert "reusing the demo user's key" in again.log()

    # Ctrl-C stops it the same way.
    pg_pid2 = postmaster_pid(data_dir)
    assert pg_pid2 is not None
    again.ctrl_c()
    assert again.wait() == 0, again.log()
    assert_all_gone(again.seen_pids | {pg_pid2}, data_dir)

    # The admin commands find the (stopped) embedded database through the env file, and say
    # clearly that it is not running.
    r = run_sftq("admin", "list-users", "--data-dir", str(data_dir))
    assert r.returncode == 6, r.stderr
    assert "cannot reach the database" in r.stderr and "sftq dev" in r.stderr


def test_stack_on_database_url(
    stacks: DevStacks, db_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    dev = stacks.start(data_dir, database_url=db_url)
    values = dev.wait_ready()
    assert values["DATABASE_URL"] == db_url
    assert not (data_dir / "pg").exists(), "must not start an embedded database"
    run_flow(http, values)
    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
    assert_all_gone(dev.seen_pids)

    # The key kept in the env file still works, so a restart prints it again.
    again = stacks.start(data_dir, database_url=db_url)
    assert again.wait_ready()["SFTQ_API_KEY"] == values["SFTQ_API_KEY"]
    again.send(signal.SIGTERM)
    assert again.wait() == 0


def test_ticker_admits_without_a_manual_tick(
    stacks: DevStacks, db_url: str, http: httpx.Client
) -> None:
    dev = stacks.start(database_url=db_url, tick_interval=0.5)
    values = dev.wait_ready()
    ticker = dev.child_matching("ticker")
    job_id = submit(http, values)
    wait_until(
        lambda: get_job(http, values, job_id)["state"] == "PROGRESS",
        30,
        "the ticker to admit the job",
    )
    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
    assert_all_gone(dev.seen_pids)
    assert not alive(ticker)


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_the_log_has_one_line_per_tick_and_details_with_verbose(
    stacks: DevStacks, db_url: str, http: httpx.Client, verbose: bool
) -> None:
    dev = stacks.start(
        database_url=db_url, tick_interval=0.5, extra=("--verbose",) if verbose else ()
    )
    values = dev.wait_ready()
    job_id = submit(http, values)  # so that ticks call the provider: quota, create, get
    wait_until(lambda: get_job(http, values, job_id)["state"] == "PROGRESS", 30, "admission")
    wait_until(lambda: len(re.findall(r"tick \d+ ok:", dev.log())) >= 4, 30, "a few ticks")
    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()

    log = dev.log()
    per_tick = Counter(re.findall(r"\btick (\d+) \w+:", log))
    provider_requests = re.findall(r"^HTTP Request: [A-Z]+ \S+/v1/accounts/", log, re.M)
    if verbose:
        # Details: the ticker's own line beside the function's, and each provider request.
        assert min(per_tick.values()) == 2, log
        assert provider_requests, log
    else:
        assert set(per_tick.values()) == {1}, log
        assert not provider_requests and "HTTP Request:" not in log, log


def test_a_child_that_dies_stops_everything(stacks: DevStacks, db_url: str) -> None:
    dev = stacks.start(database_url=db_url, tick_interval=30)
    dev.wait_ready()
    simulator = dev.child_matching("sftq_server.simulator")
    os.kill(simulator, signal.SIGKILL)
    code = dev.wait(timeout=30)
    assert code != 0
    assert "simulator" in dev.log() and "exited unexpectedly" in dev.log()
    assert_all_gone(dev.seen_pids)


def test_embedded_database_dying_stops_everything(stacks: DevStacks, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # The saved port is taken by someone else: the database moves to a free one and says so.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        (data_dir / "pg.port").write_text(f"{taken}\n")
        dev = stacks.start(data_dir)
        values = dev.wait_ready()
    moved = int((data_dir / "pg.port").read_text())
    assert moved != taken
    assert values["DATABASE_URL"].endswith(f":{moved}/sftq")
    assert f"port {taken} saved for PostgreSQL is taken" in dev.log()

    pg_pid = postmaster_pid(data_dir)
    assert pg_pid is not None
    os.kill(pg_pid, signal.SIGKILL)
    assert dev.wait(timeout=30) != 0
    assert "PostgreSQL stopped unexpectedly" in dev.log()
    assert_all_gone(dev.seen_pids)


def test_one_stack_per_data_dir(stacks: DevStacks, db_url: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = stacks.start(data_dir, database_url=db_url)
    values = first.wait_ready()
    second = stacks.start(data_dir, database_url=db_url)
    assert second.wait(timeout=60) != 0
    assert "in use by another `sftq dev`" in second.log()
    # The first one is untouched.
    assert httpx.get(f"{values['SUPABASE_URL']}/functions/v1/jobs-api/health").status_code == 200
    first.send(signal.SIGTERM)
    assert first.wait() == 0


def test_a_second_stack_in_the_same_folder_is_told_the_folder_is_in_use(
    stacks: DevStacks, db_url: str, tmp_path: Path
) -> None:
    # The same command twice (same folder, same ports): the answer is the folder's lock, not
    # the ports the first one holds, so a person does not try --port only to hit the lock.
    data_dir = tmp_path / "data"
    port, sim_port = free_port(), free_port()
    first = stacks.start(data_dir, database_url=db_url, port=port, simulator_port=sim_port)
    first.wait_ready()
    second = stacks.start(data_dir, database_url=db_url, port=port, simulator_port=sim_port)
    assert second.wait(timeout=60) == 1
    assert f"{data_dir} is in use by another `sftq dev` (pid {first.pid})" in second.log()
    assert "already in use" not in second.log()
    assert second.lines == []
    first.send(signal.SIGTERM)
    assert first.wait() == 0


def test_port_in_use_is_a_clear_error(stacks: DevStacks, db_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        dev = stacks.start(database_url=db_url, port=busy.getsockname()[1])
        assert dev.wait(timeout=60) == 2
    assert "already in use" in dev.log() and "--port" in dev.log()
    assert dev.lines == []


def test_fireworks_provider_needs_credentials(stacks: DevStacks, db_url: str) -> None:
    dev = stacks.start(database_url=db_url, extra=("--provider", "fireworks"))
    assert dev.wait(timeout=60) == 2
    assert "FIREWORKS_API_KEY" in dev.log() and "FIREWORKS_ACCOUNT_ID" in dev.log()
    assert dev.lines == []


def test_serve_runs_just_the_gateway(db_url: str) -> None:
    import subprocess
    import sys

    from sftq_client.cli import SERVER_COMMANDS

    port = free_port()
    args = ("serve", "--port", str(port), "--database-url", db_url)
    # `sftq serve` once the user CLI hands `serve` to the server package; the same command
    # through the server's own entry point until then.
    argv = (
        sftq_argv(*args)
        if "serve" in SERVER_COMMANDS
        else [sys.executable, "-m", "sftq_server.cli.dev", *args]
    )
    proc = subprocess.Popen(
        argv, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: _health(port), 30, "the gateway to answer")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _health(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/functions/v1/jobs-api/health").status_code == 200
    except httpx.TransportError:
        return False


def test_children_die_with_a_killed_supervisor(stacks: DevStacks, db_url: str) -> None:
    # kill -9 gives the supervisor no chance to stop anything; the kernel's parent-death
    # signal still takes every child down with it.
    dev = stacks.start(database_url=db_url, tick_interval=30)
    dev.wait_ready()
    children = dev.track()
    assert len(children) >= 3
    dev.send(signal.SIGKILL)
    assert dev.wait() == -signal.SIGKILL
    assert_all_gone(children)


def test_fireworks_provider_uses_the_fireworks_settings(
    stacks: DevStacks, db_url: str, http: httpx.Client
) -> None:
    # "Fireworks" here is a simulator of our own, reached only through FIREWORKS_* settings.
    from sftq_server.simulator import Simulator, SimulatorServer

    with SimulatorServer(Simulator(account_id="acct-e2e", job_seconds=0)) as fireworks:
        dev = stacks.start(
            database_url=db_url,
            extra=("--provider", "fireworks"),
            env={
                "FIREWORKS_API_KEY": "fw-test-key",
                "FIREWORKS_ACCOUNT_ID": "acct-e2e",
                "FIREWORKS_BASE_URL": fireworks.url,
            },
        )
        values = dev.wait_ready()
        assert values["SIMULATOR_URL"] == ""
        assert "sftq_server.simulator" not in " ".join(cmdline(p) for p in dev.track())

        job_id = submit(http, values)
        tick(http, values)
        job = get_job(http, values, job_id)
        assert job["state"] == "PROGRESS"
        assert str(job["fireworks_job_name"]).startswith("accounts/acct-e2e/")
        assert [j["name"] for j in fireworks.simulator.jobs()] == [job["fireworks_job_name"]]

        dev.send(signal.SIGTERM)
        assert dev.wait() == 0, dev.log()
        assert_all_gone(dev.seen_pids)


def test_a_restart_changes_nothing_a_user_can_see(
    stacks: DevStacks, db_url: str, http: httpx.Client, tmp_path: Path
) -> None:
    # Issue 54 item 1: the simulator kept its jobs in memory, so after a restart every PROGRESS
    # job was CANCELLED ("provider reported NOT_FOUND"). Simulated jobs run 25 s here.
    data_dir = tmp_path / "data"
    port, sim_port = free_port(), free_port()

    def start() -> tuple[DevProcess, dict[str, str]]:
        dev = stacks.start(data_dir, database_url=db_url, port=port, simulator_port=sim_port,
                           job_seconds=25)
        return dev, dev.wait_ready()

    def stop(dev: DevProcess) -> None:
        dev.send(signal.SIGTERM)
        assert dev.wait() == 0, dev.log()
        # Stopping is quiet: no asyncio task left pending in any child.
        assert "Task was destroyed" not in dev.log(), dev.log()

    dev, values = start()
    started = time.monotonic()
    job_id = submit(http, values)
    tick(http, values)
    before = get_job(http, values, job_id)
    assert before["state"] == "PROGRESS", before
    stop(dev)

    # Up again within the job's run: still running, at Fireworks and in the queue.
    dev, values = start()
    tick(http, values)
    after = get_job(http, values, job_id)
    assert after["state"] == "PROGRESS", after
    assert after["error"] is None and after["fireworks_job_name"] == before["fireworks_job_name"]
    stop(dev)

    # Down until the job's run time has passed: it finished while the stack was down, and the
    # next tick records it.
    time.sleep(max(0.0, 26 - (time.monotonic() - started)))
    dev, values = start()
    tick(http, values)
    done = get_job(http, values, job_id)
    assert done["state"] == "SUCCESS", done
    stop(dev)
    # The simulated account lives in the data dir, next to the database's files.
    assert (data_dir / "simulator.json").is_file()


def test_two_stacks_started_at_once_each_get_their_own_database_port(
    stacks: DevStacks, tmp_path: Path
) -> None:
    # Issue 54 item 15: two `sftq dev` in two folders, started together, both found the
    # database's port free before either had bound it (initdb takes seconds), and the second
    # failed. Both folders want the same port here, as both want 54329 on a first start.
    wanted = free_port()
    dirs = [tmp_path / "one", tmp_path / "two"]
    for folder in dirs:
        folder.mkdir()
        (folder / "pg.port").write_text(f"{wanted}\n")
    devs = [stacks.start(folder) for folder in dirs]
    values = [dev.wait_ready() for dev in devs]
    ports = {int((folder / "pg.port").read_text()) for folder in dirs}
    assert len(ports) == 2 and wanted in ports, (ports, [dev.log() for dev in devs])
    for folder, vals in zip(dirs, values, strict=True):
        port = int((folder / "pg.port").read_text())
        assert vals["DATABASE_URL"].endswith(f"@127.0.0.1:{port}/sftq"), vals
        assert httpx.get(f"{vals['SUPABASE_URL']}/functions/v1/jobs-api/health").status_code == 200
    for dev in devs:
        dev.send(signal.SIGTERM)
        assert dev.wait() == 0, dev.log()


def test_stopping_while_an_mcp_call_waits_leaves_no_task_pending(
    stacks: DevStacks, db_url: str, http: httpx.Client
) -> None:
    # Issue 54 item 11: "Task was destroyed but it is pending!" on stop, after an MCP client
    # had used the stack: the MCP loop was closed with a call's task still pending (here a
    # wait_for_job that streams its progress, as an agent leaves one running).
    import threading

    dev = stacks.start(database_url=db_url)
    values = dev.wait_ready()
    job_id = submit(http, values)  # QUEUED, and no ticker: the wait outlasts the stack
    url = f"{values['SUPABASE_URL']}/functions/v1/mcp"
    headers = {"Authorization": f"Bearer {values['SFTQ_API_KEY']}",
               "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    opened = threading.Event()

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(timeout=60) as client, \
                client.stream("POST", url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                        "name": "wait_for_job", "_meta": {"progressToken": "p"},
                        "arguments": {"job_id": job_id, "timeout_seconds": 600}}}) as stream:
            opened.set()
            for _ in stream.iter_bytes():
                pass

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert opened.wait(15)
    time.sleep(1.0)
    dev.send(signal.SIGTERM)
    assert dev.wait() == 0, dev.log()
    caller.join(15)
    assert "Task was destroyed" not in dev.log(), dev.log()
    assert "Traceback" not in dev.log(), dev.log()
