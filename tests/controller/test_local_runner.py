"""The local runner end to end: a real Gateway, a real controller and real agent processes.

One Gateway and one controller serve every test of this module (each test makes its own
rollouts); tests that stop or restart the controller are in test_lifecycle.py.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from agentlightning.client import GatewayClient
from agentlightning.procs import ManagedProcess
from agentlightning.schemas import Model
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import (
    GATEWAY_OVERRIDES,
    file_text,
    local_config,
    pid_alive,
    start_controller,
    wait_terminal,
    wait_until,
)
from tests.fakes.model_server import FakeModelServer, Reply

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "controller-key"
AGENTS = "tests.controller.agents"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, fake: FakeModelServer) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), KEY, *GATEWAY_OVERRIDES)
    with GatewayClient(gateway.url, KEY) as c:
        c.register_models([Model(model="policy", endpoint=fake.base_url)])
    yield gateway
    gateway.process.stop()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ctl") / "logs"


@pytest.fixture(scope="module")
def controller(gw: RunningGateway, log_dir: Path) -> Iterator[ManagedProcess]:
    proc = start_controller(gw.url, KEY, log_dir, "local_runner.maximum_size=6")
    yield proc
    assert proc.alive(), f"the controller died:\n{proc.log_tail(60)}"
    proc.stop()


@pytest.fixture
def client(gw: RunningGateway, controller: ManagedProcess) -> Iterator[GatewayClient]:
    with GatewayClient(gw.url, KEY) as c:
        yield c


def create(
    client: GatewayClient, config: dict, input: object = None, is_train: bool = True, **extra: object
) -> str:
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    client.create_rollouts(
        [{"rollout_id": rollout_id, "input": input, "is_train": is_train, "config": {**config, **extra}}]
    )
    return rollout_id


def reward_events(client: GatewayClient, rollout_id: str) -> list[dict]:
    return [e.data for e in client.get_events(rollout_id, event_type="reward")]


def test_agents_run_with_their_own_environment_and_report_rewards(
    client: GatewayClient, gw: RunningGateway
) -> None:
    questions = ["first question", "second question", "third"]
    ids = [
        create(
            client,
            local_config(f"{AGENTS}:RewardAgent", QUESTION="input.q", NUMBER="input.n"),
            {"q": q, "n": i},
        )
        for i, q in enumerate(questions)
    ]
    val_id = create(
        client, local_config(f"{AGENTS}.AsyncRewardAgent", QUESTION="input.q"), {"q": "v"}, is_train=False
    )
    done = wait_terminal(client, [*ids, val_id])
    infos = []
    for i, (rollout_id, question) in enumerate(zip(ids, questions, strict=True)):
        status = done[rollout_id].status
        assert status.state == "succeeded", status.error_message
        [info] = reward_events(client, rollout_id)  # read from the last attempt, as the trainer does
        attempt = status.last_attempt_id
        assert attempt and attempt.startswith("attempt-1-")
        assert info["question"] == question and info["number"] == str(i)  # strings as-is, the rest as JSON
        assert (
            info["base_url"] == f"{gw.url}/proxy/rollout/{rollout_id}/attempt/{attempt}/mode/train/openai/v1"
        )
        assert info["pid"] == info["pgid"] == info["sid"]  # its own session and process group
        assert info["import_pid"] != info["pid"]  # forked from the warm process that imported the module
        assert status.log_path and "reward agent running in" in Path(status.log_path).read_text()
        infos.append(info)
    assert len({i["pid"] for i in infos}) == 3 and len({i["random"] for i in infos}) == 3
    [val] = reward_events(client, val_id)
    assert val["value"] == 0.5 and "/mode/val/openai/v1" in val["base_url"]  # async run(), is_train=False


def test_agent_calls_the_model_through_the_proxy(client: GatewayClient, fake: FakeModelServer) -> None:
    fake.script(Reply(content="four"))
    rollout_id = create(
        client, local_config("tests.controller.openai_agent:OpenAIAgent", QUESTION="input.q"), {"q": "2+2?"}
    )
    status = wait_terminal(client, [rollout_id], timeout=60)[rollout_id].status
    assert status.state == "succeeded", status.error_message
    events = client.get_events(rollout_id)
    calls = [e for e in events if e.event_type == "model_request"]
    assert [e.event_type for e in events] == ["model_request", "reward"]
    assert calls[0].attempt_id == status.last_attempt_id
    assert calls[0].data["request"]["messages"][0]["content"] == "2+2?"
    assert events[1].data["content"] == "four" and events[1].data["value"] == 1.0
    triplets = client.get_events_json(rollout_id, format="triplet")
    assert triplets[0]["data"]["response_token_ids"]  # usable for training


def test_crash_fails_with_exit_code_and_last_output(client: GatewayClient) -> None:
    crash = create(client, local_config(f"{AGENTS}.CrashAgent"))
    code = create(client, local_config(f"{AGENTS}.ExitCodeAgent"))
    segv = create(client, local_config(f"{AGENTS}.SegfaultAgent"))
    done = wait_terminal(client, [crash, code, segv])
    message = done[crash].status.error_message or ""
    assert done[crash].status.state == "failed"
    assert message.startswith("agent exited with code 1")
    assert "RuntimeError: the agent broke on purpose" in message and "about to fail" in message
    assert done[code].status.state == "failed"
    assert (done[code].status.error_message or "").startswith("agent exited with code 3")
    assert "crashed (SIGSEGV)" in (done[segv].status.error_message or "")
    for rollout_id in (crash, code, segv):  # an agent failure is not retried
        assert (done[rollout_id].status.last_attempt_id or "").startswith("attempt-1-")


def test_missing_env_map_path_fails_naming_it(client: GatewayClient) -> None:
    missing = create(client, local_config(f"{AGENTS}.RewardAgent", QUESTION="input.question"), {"q": 1})
    index = create(client, local_config(f"{AGENTS}.RewardAgent", FIRST="input.items.3"), {"items": [1]})
    done = wait_terminal(client, [missing, index])
    assert done[missing].status.state == "failed"
    assert "env_map QUESTION" in (done[missing].status.error_message or "")
    assert "'input.question'" in (done[missing].status.error_message or "")
    assert "has no key 'question'" in (done[missing].status.error_message or "")
    assert "index 3 is out of range" in (done[index].status.error_message or "")
    assert client.get_events(missing) == []  # no process was started


def test_bad_agent_class_fails_with_a_clear_message(client: GatewayClient) -> None:
    no_module = create(client, local_config("no_such_module.Agent"))
    no_class = create(client, local_config(f"{AGENTS}:NoSuchAgent"))
    no_run = create(client, local_config(f"{AGENTS}.NoRun"))
    malformed = create(client, local_config("not a class"))
    no_config = create(client, {})
    done = wait_terminal(client, [no_module, no_class, no_run, malformed, no_config])
    messages = {k: done[k].status.error_message or "" for k in done}
    assert all(done[k].status.state == "failed" for k in done)
    assert "cannot import module 'no_such_module'" in messages[no_module]
    assert "has no 'NoSuchAgent'" in messages[no_class]
    assert "has no run() method" in messages[no_run]
    assert "must look like 'package.module.Class'" in messages[malformed]
    assert "config.local.agent_class" in messages[no_config]


def test_timeout_kills_the_whole_process_group(client: GatewayClient, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    rollout_id = create(
        client,
        local_config(f"{AGENTS}.SleepAgent", PID_FILE="input.pid_file"),
        {"pid_file": str(pid_file)},
        timeout_seconds=1.5,
    )
    agent_pid, grandchild_pid = map(int, wait_until(partial(file_text, pid_file), 20, "the agent").split())
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed"
    assert "timed out after 1.5s" in (status.error_message or "")
    wait_until(lambda: not pid_alive(agent_pid) and not pid_alive(grandchild_pid), 10, "the group to be gone")


def test_module_that_starts_threads_runs_in_a_fresh_interpreter(client: GatewayClient) -> None:
    rollout_id = create(client, local_config("tests.controller.threaded_agent:ThreadedAgent"))
    status = wait_terminal(client, [rollout_id], timeout=60)[rollout_id].status
    assert status.state == "succeeded", status.error_message
    [info] = reward_events(client, rollout_id)
    assert info["import_pid"] == info["pid"]  # imported by the agent process itself


def test_a_hostile_agent_holds_only_its_own_token(client: GatewayClient, tmp_path: Path) -> None:
    """The agent's AGL_KEY is a token for its attempt: against another running rollout, the
    models and the proxy, every attempt fails and nothing changes; its own reward goes through."""
    pid_file, go_file = tmp_path / "victim.pid", tmp_path / "go"
    victim = create(
        client,
        local_config(f"{AGENTS}:WaitForFileAgent", PID_FILE="input.pid", GO_FILE="input.go"),
        {"pid": str(pid_file), "go": str(go_file)},
    )
    wait_until(pid_file.exists, what="the victim agent to start")
    victim_attempt = client.get_rollout(victim).rollout.status.last_attempt_id
    models = client.list_models()
    hostile = create(
        client,
        local_config(f"{AGENTS}:HostileAgent", VICTIM="input.victim", VICTIM_ATTEMPT="input.attempt"),
        {"victim": victim, "attempt": victim_attempt},
    )
    status = wait_terminal(client, [hostile])[hostile].status
    assert status.state == "succeeded", status.error_message
    [report] = reward_events(client, hostile)
    assert report["key_prefix"] == "agl1"  # a token, not the controller's key
    assert set(report["tries"]) >= {
        "delete_victim",
        "reward_victim",
        "register_model",
        "pause",
        "victim_proxy",
    }
    assert all(code in (401, 403) for code in report["tries"].values()), report["tries"]
    # Nothing changed: the victim still runs with no events, models and proxy as they were.
    assert client.get_rollout(victim).rollout.status.state == "running"
    assert client.get_events(victim) == []
    assert client.list_models() == models and client.proxy_state().paused is False
    go_file.touch()
    assert wait_terminal(client, [victim])[victim].status.state == "succeeded"
    assert [e["value"] for e in reward_events(client, victim)] == [1.0]


EDITED_AGENT = """
import os

import httpx

VERSION = {version}


class Agent:
    def run(self) -> None:
        headers = {{"Authorization": f"Bearer {{os.environ['AGL_KEY']}}"}}
        body = {{"event_type": "reward", "data": {{"value": VERSION}}}}
        httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers).raise_for_status()
"""


def test_an_agent_edited_on_disk_is_imported_again(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """The warm process keeps the module it imported; the controller sees the file change and
    starts a new one, so the next rollout runs the code on disk (and says so in its log)."""
    gw = gateway_factory(*GATEWAY_OVERRIDES, key=KEY)  # its own: the module's controller runs in REPO
    agents = tmp_path / "agents_dir"
    agents.mkdir()
    module = f"edited_agent_{uuid.uuid4().hex[:8]}"
    source = agents / f"{module}.py"
    source.write_text(EDITED_AGENT.format(version=1))
    controller = start_controller(
        gw.url, KEY, tmp_path / "logs", f"local_runner.cwd={agents}", "log_level=info"
    )
    try:
        with GatewayClient(gw.url, KEY) as client:
            first = create(client, local_config(f"{module}:Agent"))
            assert wait_terminal(client, [first])[first].status.state == "succeeded"
            assert [e["value"] for e in reward_events(client, first)] == [1]
            before = source.stat().st_mtime_ns
            source.write_text(EDITED_AGENT.format(version=2))
            os.utime(source, ns=(before + 10**9, before + 10**9))  # a coarse clock cannot hide the edit
            second = create(client, local_config(f"{module}:Agent"))
            assert wait_terminal(client, [second])[second].status.state == "succeeded"
            assert [e["value"] for e in reward_events(client, second)] == [2]
        log = wait_until(
            lambda: controller.log_tail(200) if "agent_source_changed" in controller.log_tail(200) else None
        )
        assert str(source) in log
    finally:
        controller.stop()


REWARD_BY_COMMAND = """
import os, httpx
httpx.post(os.environ["AGL_EVENT_URL"], headers={"Authorization": "Bearer " + os.environ["AGL_KEY"]},
           json={"event_type": "reward", "data": {"value": float(os.environ["VALUE"])}}).raise_for_status()
"""


def test_an_agent_given_as_a_command_reports_its_reward(client: GatewayClient) -> None:
    """Any program is an agent (config.local.command): here a Python script not a class."""
    rollout_id = create(
        client,
        {"local": {"command": [sys.executable, "-c", REWARD_BY_COMMAND], "env_map": {"VALUE": "input.v"}}},
        {"v": 0.75},
    )
    status = wait_terminal(client, [rollout_id], timeout=60)[rollout_id].status
    assert status.state == "succeeded", status.error_message
    assert reward_events(client, rollout_id) == [{"value": 0.75}]


def test_a_command_agents_timeout_kills_what_it_started(client: GatewayClient, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    rollout_id = create(client, {"local": {"command": ["sh", "-c", script]}}, timeout_seconds=1.5)
    sleeper = int(wait_until(lambda: file_text(pid_file).strip(), 20, "the agent"))
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed" and "timed out after 1.5s" in (status.error_message or "")
    wait_until(lambda: not pid_alive(sleeper), 10, "the command's child to be gone")


def test_a_command_killed_from_outside_is_not_the_agents_fault(client: GatewayClient) -> None:
    """Killed by a signal the Controller did not send (the OOM killer's SIGKILL): as a class agent."""
    rollout_id = create(client, {"local": {"command": ["sh", "-c", "kill -KILL $$"]}})
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed"
    assert "killed by SIGKILL, which the controller did not send" in (status.error_message or "")
