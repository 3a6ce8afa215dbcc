"""Cross-version runs with a real agent: v1.0.2's `agl-controller` against our Gateway, and ours
against v1.0.2's `agl-server`. The agent (stdlib only, so that either venv can run it) calls the
model through the proxy and posts its reward, as any v1.0 agent does."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutState
from tests.compat.conftest import KEY, V1Gateway, start_v1
from tests.conftest import start_gateway
from tests.controller.helpers import GATEWAY_OVERRIDES, start_controller, wait_terminal
from tests.fakes.model_server import FakeModelServer, Reply

pytestmark = pytest.mark.timeout(240)

AGENT = """
import json, os, urllib.request

def post(url, body):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["AGL_KEY"]},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())

class CompatAgent:
    def run(self):
        question = os.environ["QUESTION"]
        answer = post(
            os.environ["AGL_OPENAI_BASE_URL"] + "/chat/completions",
            {"model": "any", "messages": [{"role": "user", "content": question}], "max_tokens": 8},
        )
        content = answer["choices"][0]["message"]["content"]
        kind = "token" if os.environ["AGL_KEY"].startswith("agl1.") else "key"
        post(os.environ["AGL_EVENT_URL"], {"event_type": "reward", "data": {"value": 1.0, "content": content, "key": kind}})
"""


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    """A directory with the agent module; controllers run their agents there."""
    path = tmp_path / "agents"
    path.mkdir()
    (path / "compat_agent.py").write_text(AGENT)
    return path


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def run_rollouts(client: GatewayClient, fake: FakeModelServer, n: int = 3) -> list[str]:
    """Register the model, create n rollouts of the agent, wait until they end; their ids."""
    client.register_models([Model(model="policy", endpoint=fake.base_url)])
    fake.script(*[Reply(content=f"answer {i}") for i in range(n)])
    ids = [f"x-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    client.create_rollouts(
        [
            {
                "rollout_id": rid,
                "input": {"q": f"question {i}"},
                "config": {
                    "timeout_seconds": 120,
                    "local": {"agent_class": "compat_agent.CompatAgent", "env_map": {"QUESTION": "input.q"}},
                },
            }
            for i, rid in enumerate(ids)
        ]
    )
    return ids


def check_outcome(client: GatewayClient, ids: list[str], key_kind: str) -> None:
    done = wait_terminal(client, ids, timeout=120)
    for rid in ids:
        status = done[rid].status
        assert status.state == RolloutState.SUCCEEDED, status.error_message
        events = client.get_events(rid)
        assert [e.event_type for e in events] == ["model_request", "reward"], events
        call, reward = events
        assert call.data["request"]["messages"][0]["content"].startswith("question ")
        assert reward.data["content"].startswith("answer ") and reward.data["key"] == key_kind
        triplet, _ = client.get_events_json(rid, format="triplet")
        assert triplet["data"]["prompt_token_ids"] and triplet["data"]["response_token_ids"]


def test_v1_controller_runs_agents_against_our_gateway(
    v1_bin: Path, tmp_path: Path, agent_dir: Path, fake: FakeModelServer
) -> None:
    gateway = start_gateway(tmp_path, KEY, *GATEWAY_OVERRIDES)
    controller = start_v1(
        v1_bin,
        "agl-controller",
        agent_dir,  # its agents import compat_agent from their working directory
        "runner_type=local",
        f"agl_server.url={gateway.url}",
        f"agl_server.key={KEY}",
        "local_runner.poll_interval=0.3",
    )
    try:
        with GatewayClient(gateway.url, KEY) as client:
            ids = run_rollouts(client, fake)
            check_outcome(client, ids, key_kind="key")  # v1.0's controller passes its key on
            assert all(client.get_rollout(rid).attempts == ["0"] for rid in ids)  # v1.0's attempt id
        assert controller.alive(), controller.log_tail(40)
    finally:
        controller.stop()
        gateway.process.stop()


def test_our_controller_runs_agents_against_the_v1_gateway(
    v1_gateway_factory: Callable[..., V1Gateway], tmp_path: Path, agent_dir: Path, fake: FakeModelServer
) -> None:
    gateway = v1_gateway_factory("default_proxy.model_name=policy")
    controller = start_controller(
        gateway.url,
        KEY,
        tmp_path / "ctl" / "logs",
        f"local_runner.cwd={agent_dir}",
    )
    try:
        with GatewayClient(gateway.url, KEY) as client:
            ids = run_rollouts(client, fake)
            check_outcome(client, ids, key_kind="key")  # no token route in v1.0: the key, as v1.0 did
        assert controller.alive(), controller.log_tail(40)
        assert "agent_tokens_unsupported" in controller.log_tail(200)
    finally:
        controller.stop()


def test_our_controller_with_a_controller_key_gives_agents_tokens(
    tmp_path: Path, agent_dir: Path, fake: FakeModelServer
) -> None:
    """The split setup: the controller holds only the controller key, each agent its own token."""
    gateway = start_gateway(tmp_path, KEY, "controller_key=ctl-key", *GATEWAY_OVERRIDES)
    controller = start_controller(
        gateway.url, "ctl-key", tmp_path / "ctl" / "logs", f"local_runner.cwd={agent_dir}"
    )
    try:
        with GatewayClient(gateway.url, KEY) as client:
            ids = run_rollouts(client, fake)
            check_outcome(client, ids, key_kind="token")
        assert controller.alive(), controller.log_tail(40)
    finally:
        controller.stop()
        gateway.process.stop()
