"""Controller life cycle with real processes: shutdown, restart recovery, retries as new
attempts, Gateway outages, cancellation, long-poll start and v1.0 compatibility both ways."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest

from agentlightning.client import GatewayClient
from agentlightning.controller.runner import new_attempt_id
from agentlightning.procs import ManagedProcess, free_port
from agentlightning.schemas import RolloutState
from tests.conftest import RunningGateway
from tests.controller.helpers import (
    GATEWAY_OVERRIDES,
    file_text,
    local_config,
    pid_alive,
    start_controller,
    start_gateway_at,
    wait_terminal,
    wait_until,
)

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "lifecycle-key"
AGENTS = "tests.controller.agents"


@pytest.fixture
def gw(gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory(*GATEWAY_OVERRIDES, key=KEY)


@pytest.fixture
def client(gw: RunningGateway) -> Iterator[GatewayClient]:
    with GatewayClient(gw.url, KEY) as c:
        yield c


@pytest.fixture
def controllers() -> Iterator[list[ManagedProcess]]:
    """Controllers a test starts; whatever still runs at the end is stopped."""
    started: list[ManagedProcess] = []
    yield started
    for proc in started:
        proc.stop()


def create(client: GatewayClient, agent: str, input: object = None, **env_map: str) -> str:
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    client.create_rollouts(
        [{"rollout_id": rollout_id, "input": input, "config": local_config(agent, **env_map)}]
    )
    return rollout_id


def read_pid(path: Path, timeout: float = 30.0) -> int:
    return int(wait_until(partial(file_text, path), timeout, f"{path.name} to be written"))


def waiting_agent(
    client: GatewayClient, tmp_path: Path, name: str, agent: str = "WaitForFileAgent"
) -> tuple[str, Path, Path]:
    pid_file, go_file = tmp_path / f"{name}.pid", tmp_path / f"{name}.go"
    rollout_id = create(
        client,
        f"{AGENTS}.{agent}",
        {"pid": str(pid_file), "go": str(go_file)},
        PID_FILE="input.pid",
        GO_FILE="input.go",
    )
    return rollout_id, pid_file, go_file


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_agents_and_fails_their_rollouts(
    sig: signal.Signals,
    gw: RunningGateway,
    client: GatewayClient,
    tmp_path: Path,
    controllers: list[ManagedProcess],
) -> None:
    ctl = start_controller(gw.url, KEY, tmp_path / "logs")
    controllers.append(ctl)
    ids, pid_files = [], []
    for name in ("a", "b"):
        pid_file = tmp_path / f"{name}.pid"
        ids.append(create(client, f"{AGENTS}.SleepAgent", {"pid": str(pid_file)}, PID_FILE="input.pid"))
        pid_files.append(pid_file)
    pids = [int(p) for f in pid_files for p in wait_until(partial(file_text, f), 30, "agents").split()]
    os.kill(ctl.pid, sig)  # the controller only, as a supervisor would
    assert ctl.proc is not None and ctl.proc.wait(20) == 0, ctl.log_tail()
    for rollout in (client.get_rollout(i).rollout for i in ids):
        assert rollout.status.state == "failed"
        assert f"the controller shut down ({sig.name}) while the agent was running" in (
            rollout.status.error_message or ""
        )
    wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "agents and their children to be gone")


def test_restart_adopts_live_agents_and_reports_those_that_ended_meanwhile(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    logs = tmp_path / "logs"
    first = start_controller(gw.url, KEY, logs)
    controllers.append(first)
    live, live_pid_file, live_go = waiting_agent(client, tmp_path, "live")
    ended, ended_pid_file, ended_go = waiting_agent(client, tmp_path, "ended")
    live_pid, ended_pid = read_pid(live_pid_file), read_pid(ended_pid_file)
    attempts = {i: client.get_rollout(i).rollout.status.last_attempt_id for i in (live, ended)}
    first.kill()  # a crash: the agents live on in their own sessions
    assert pid_alive(live_pid) and pid_alive(ended_pid)
    ended_go.touch()
    wait_until(lambda: not pid_alive(ended_pid), 20, "the agent to end while no controller runs")
    second = start_controller(gw.url, KEY, logs)
    controllers.append(second)
    wait_until(lambda: "attempt_adopted" in second.log_tail(200), 20, "the live agent to be adopted")
    live_go.touch()
    done = wait_terminal(client, [live, ended])
    for rollout_id in (live, ended):
        status = done[rollout_id].status
        assert status.state == "succeeded", status.error_message
        assert status.last_attempt_id == attempts[rollout_id]  # the same attempt, not a new one
        assert [e.data["value"] for e in client.get_events(rollout_id, event_type="reward")] == [1.0]


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_restart_with_the_agent_gone_fails_or_retries_as_a_new_attempt(
    max_attempts: int,
    gw: RunningGateway,
    client: GatewayClient,
    tmp_path: Path,
    controllers: list[ManagedProcess],
) -> None:
    logs, setting = tmp_path / "logs", f"max_attempts={max_attempts}"
    first = start_controller(gw.url, KEY, logs, setting)
    controllers.append(first)
    pid_file = tmp_path / "flaky.pid"
    rollout_id = create(client, f"{AGENTS}.FlakyAgent", {"pid": str(pid_file)}, PID_FILE="input.pid")
    pid = read_pid(pid_file)
    first_attempt = client.get_rollout(rollout_id).rollout.status.last_attempt_id
    first.kill()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, "the agent to die")
    controllers.append(start_controller(gw.url, KEY, logs, setting))
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    if max_attempts == 1:
        assert status.state == "failed"
        assert f"no live agent for attempt {first_attempt} after the controller restarted" in (
            status.error_message or ""
        )
        assert status.last_attempt_id == first_attempt
    else:
        assert status.state == "succeeded", status.error_message
        assert status.last_attempt_id and status.last_attempt_id.startswith("attempt-2-")
        assert status.error_message is None
        rewards = client.get_events(rollout_id, event_type="reward")  # the trainer reads the last attempt
        assert [e.attempt_id for e in rewards] == [status.last_attempt_id]
        assert client.get_events(rollout_id, attempt_id=first_attempt) == []


def test_restart_runs_a_claimed_rollout_whose_agent_never_started_as_a_new_attempt(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    """A controller killed between claiming a rollout and starting its agent: the loss is the
    controller's, so the next one runs the rollout as a new attempt even with max_attempts=1."""
    rollout_id = create(client, f"{AGENTS}.RewardAgent")
    claimed = new_attempt_id(1)
    client.patch_rollout(rollout_id, state="running", last_attempt_id=claimed)  # the claim, no agent
    controllers.append(start_controller(gw.url, KEY, tmp_path / "logs", "max_attempts=1"))
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "succeeded", status.error_message
    assert status.last_attempt_id and status.last_attempt_id.startswith("attempt-2-")
    assert [e.attempt_id for e in client.get_events(rollout_id, event_type="reward")] == [
        status.last_attempt_id
    ]


def test_infrastructure_failure_is_retried_as_a_new_attempt_agent_failure_is_not(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    controllers.append(start_controller(gw.url, KEY, tmp_path / "logs", "max_attempts=3"))
    pid_file = tmp_path / "flaky.pid"
    flaky = create(client, f"{AGENTS}.FlakyAgent", {"pid": str(pid_file)}, PID_FILE="input.pid")
    crash = create(client, f"{AGENTS}.CrashAgent")
    pid = read_pid(pid_file)
    first_attempt = client.get_rollout(flaky).rollout.status.last_attempt_id
    os.kill(pid, signal.SIGKILL)  # like the OOM killer: a signal the agent did not cause
    done = wait_terminal(client, [flaky, crash])
    status = done[flaky].status
    assert status.state == "succeeded", status.error_message
    assert status.last_attempt_id != first_attempt and (status.last_attempt_id or "").startswith("attempt-2-")
    assert [e.attempt_id for e in client.get_events(flaky, event_type="reward")] == [status.last_attempt_id]
    assert done[crash].status.state == "failed"
    assert (done[crash].status.last_attempt_id or "").startswith("attempt-1-")


def test_controller_survives_a_gateway_outage(tmp_path: Path, controllers: list[ManagedProcess]) -> None:
    port, db = free_port(), tmp_path / "gateway.db"
    url = f"http://127.0.0.1:{port}"
    gateway = start_gateway_at(tmp_path, port, KEY, db)
    try:
        ctl = start_controller(url, KEY, tmp_path / "logs", "agl_server.request_timeout=2")
        controllers.append(ctl)
        with GatewayClient(url, KEY) as client:
            rollout_id, pid_file, go_file = waiting_agent(client, tmp_path, "outage", "WaitThenExitAgent")
            pid = read_pid(pid_file)
        gateway.kill()
        go_file.touch()  # the agent ends while the Gateway is down: its report must wait
        wait_until(lambda: not pid_alive(pid), 10, "the agent to end")
        wait_until(lambda: "report_failed" in ctl.log_tail(100), 30, "the controller to meet the outage")
        gateway = start_gateway_at(tmp_path, port, KEY, db)
        with GatewayClient(url, KEY) as client:
            assert wait_terminal(client, [rollout_id])[rollout_id].status.state == "succeeded"
            after = create(client, f"{AGENTS}.RewardAgent")
            assert wait_terminal(client, [after])[after].status.state == "succeeded"
        assert ctl.alive()
    finally:
        gateway.stop()


def test_deleting_a_running_rollout_stops_its_agent(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    ctl = start_controller(gw.url, KEY, tmp_path / "logs")
    controllers.append(ctl)
    pid_file = tmp_path / "sleep.pid"
    rollout_id = create(client, f"{AGENTS}.SleepAgent", {"pid": str(pid_file)}, PID_FILE="input.pid")
    pids = [int(p) for p in wait_until(partial(file_text, pid_file), 30, "agent").split()]
    client.delete_rollout(rollout_id)
    wait_until(lambda: not any(pid_alive(p) for p in pids), 15, "the agent to be stopped")
    assert "the rollout was deleted" in ctl.log_tail(50)


def test_new_rollouts_start_at_once_despite_a_long_poll_interval(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    controllers.append(start_controller(gw.url, KEY, tmp_path / "logs", "local_runner.poll_interval=60"))
    first = create(client, f"{AGENTS}.RewardAgent")
    assert wait_terminal(client, [first])[first].status.state == "succeeded"
    latencies = []
    for _ in range(3):  # with plain polling each would wait up to a minute
        created = time.time()
        rollout_id = create(client, f"{AGENTS}.RewardAgent")
        assert wait_terminal(client, [rollout_id], timeout=15)[rollout_id].status.state == "succeeded"
        [reward] = client.get_events(rollout_id, event_type="reward")
        latencies.append(reward.timestamp - created)
    print(f"create -> reward recorded: {', '.join(f'{x * 1000:.0f} ms' for x in latencies)}")


def test_works_against_a_v1_gateway_by_polling(tmp_path: Path, controllers: list[ManagedProcess]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = start_gateway_at(tmp_path, port, KEY, tmp_path / "v1.db", module="tests.controller.v1_gateway")
    try:
        ctl = start_controller(url, KEY, tmp_path / "logs", "local_runner.poll_interval=0.2")
        controllers.append(ctl)
        with GatewayClient(url, KEY) as client:
            ids = [create(client, f"{AGENTS}.RewardAgent") for _ in range(3)]
            done = wait_terminal(client, ids)
        assert all(r.status.state == "succeeded" for r in done.values())
        assert all(r.status.log_path is None for r in done.values())  # v1.0 has no such field
        log = ctl.log_tail(200)
        assert "polling every 0.2s" in log and "gateway_without_log_path" in log
    finally:
        gateway.stop()


def test_fresh_interpreter_mode(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    controllers.append(start_controller(gw.url, KEY, tmp_path / "logs", "local_runner.warm_start=false"))
    rollout_id = create(client, f"{AGENTS}.RewardAgent")
    assert wait_terminal(client, [rollout_id])[rollout_id].status.state == "succeeded"
    [reward] = client.get_events(rollout_id, event_type="reward")
    assert reward.data["import_pid"] == reward.data["pid"]


def test_a_v1_controller_works_against_our_gateway(gw: RunningGateway) -> None:
    """What a v1.0 controller does, in plain HTTP: poll queuing and running, claim, report."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gw.url, headers=headers, trust_env=False) as http:
        created = http.post("/api/rollouts", json=[{"input": {"q": 1}, "config": {"timeout_seconds": 30}}])
        assert created.status_code == 201
        rollout_id = created.json()[0]["rollout_id"]
        listed = http.get("/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running")])
        assert listed.status_code == 200 and "x-agl-long-poll" not in listed.headers
        assert [r["rollout_id"] for r in listed.json()] == [rollout_id]
        claim = {"status": {"state": "running", "last_attempt_id": "a-1", "k8s_job_name": "job-1"}}
        assert http.patch(f"/api/rollouts/{rollout_id}", json=claim).json()["status"]["state"] == "running"
        event = {"event_type": "reward", "data": {"value": 1.0}}
        assert http.post(f"/api/rollouts/{rollout_id}/attempt/a-1/events", json=event).status_code == 200
        done = http.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded"}})
        assert done.json()["status"]["state"] == RolloutState.SUCCEEDED
        assert (
            http.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}}).status_code
            == 409
        )
        assert (
            http.get("/api/rollouts", params=[("state_in", "queuing"), ("state_in", "running")]).json() == []
        )


def test_agents_outlive_a_lost_warm_process(
    gw: RunningGateway, client: GatewayClient, tmp_path: Path, controllers: list[ManagedProcess]
) -> None:
    ctl = start_controller(gw.url, KEY, tmp_path / "logs")
    controllers.append(ctl)
    rollout_id, pid_file, go_file = waiting_agent(client, tmp_path, "orphan")
    read_pid(pid_file)
    line = next(x for x in ctl.log_tail(100).splitlines() if "warm_process_ready" in x)
    warm_pid = int(line.split(" pid=")[1].split()[0])
    os.kill(warm_pid, signal.SIGKILL)  # its child now belongs to nobody the controller can wait on
    wait_until(lambda: "warm_process_lost" in ctl.log_tail(100), 10, "the controller to notice")
    go_file.touch()
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "succeeded", status.error_message  # learned from the exit file
    after = create(client, f"{AGENTS}.RewardAgent")  # a new warm process serves the next one
    assert wait_terminal(client, [after])[after].status.state == "succeeded"
