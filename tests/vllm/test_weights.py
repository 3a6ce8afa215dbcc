"""Weights in real vLLM: its log-probs match the policy's forward pass on the same weights (fp32),
a reload makes it serve the new weights, and publishing under load through the Gateway loses
no call and records the version that served each one."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from agentlightning.client import GatewayClient
from agentlightning.schemas import RolloutCreate
from agentlightning.torch_backend.mismatch import mismatch, policy_log_probs
from agentlightning.torch_backend.vllm_server import reload_weights, reset_prefix_cache, save_weights
from agentlightning.trainer.publish import EndpointPublisher
from tests.conftest import RunningGateway

from .conftest import SERVED_NAME, ScriptedVLLM

pytestmark = pytest.mark.timeout(600)
PROMPTS = [
    [{"role": "user", "content": f"{name} has {x} cards and loses two. How many cards now?"}]
    for name, x in (("Bob", 4), ("Kim", 9), ("Jo", 6), ("Eve", 8))
]


@pytest.fixture(scope="module")
def policy(vllm_server: ScriptedVLLM) -> Any:
    """The served weights, loaded in this process as the trainer holds them (fp32)."""
    return AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()


@pytest.fixture
def restore_weights(vllm_server: ScriptedVLLM) -> Iterator[None]:
    """Put the scripted weights back into the shared server after the test."""
    yield
    reload_weights(vllm_server.base_url, vllm_server.model_dir)
    reset_prefix_cache(vllm_server.base_url)


def perturbed(model: Any, scale: float, seed: int) -> Any:
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
    return other


def sample(base_url: str, seed: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, response ids, vLLM's log-probs) of sampled answers (temperature 1)."""
    out = []
    for i, messages in enumerate(PROMPTS):
        r = httpx.post(
            f"{base_url}/v1/chat/completions",
            json={
                "model": SERVED_NAME,
                "messages": messages,
                "max_tokens": 24,
                "temperature": 1.0,
                "seed": seed + i,
                "logprobs": True,
                "return_token_ids": True,
            },
            timeout=120,
        ).json()
        choice = r["choices"][0]
        out.append(
            (
                r["prompt_token_ids"],
                choice["token_ids"],
                [c["logprob"] for c in choice["logprobs"]["content"]],
            )
        )
    return out


def measure(model: Any, samples: list[tuple[list[int], list[int], list[float]]]) -> dict[str, float]:
    return mismatch([s[2] for s in samples], [policy_log_probs(model, s[0], s[1]) for s in samples])


def test_fp32_log_probs_match_the_policy_and_a_reload_serves_the_new_weights(
    vllm_server: ScriptedVLLM, policy: Any, tmp_path: Path, restore_weights: None
) -> None:
    before = measure(policy, sample(vllm_server.base_url, seed=1))
    assert before["tokens"] >= 40 and before["mean_abs"] < 1e-4 and before["max_abs"] < 1e-3, before

    new = perturbed(policy, scale=0.3, seed=7)
    save_weights(new, tmp_path / "v1")
    reload_weights(vllm_server.base_url, tmp_path / "v1")
    reset_prefix_cache(vllm_server.base_url)
    after = sample(vllm_server.base_url, seed=1)
    on_new, on_old = measure(new, after), measure(policy, after)
    assert on_new["mean_abs"] < 1e-4 and on_new["max_abs"] < 1e-3, on_new
    assert on_old["mean_abs"] > 100 * max(on_new["mean_abs"], 1e-6), (on_old, on_new)


def test_publish_under_load_loses_no_call_and_records_the_serving_version(
    vllm_server: ScriptedVLLM,
    vllm_gateway: RunningGateway,
    policy: Any,
    tmp_path: Path,
    restore_weights: None,
) -> None:
    client = GatewayClient(vllm_gateway.url, vllm_gateway.key)
    client.delete_models()
    publisher = EndpointPublisher(client, SERVED_NAME, retry_after_seconds=0.2)
    publisher.register([vllm_server.endpoint], 0, replace=True)
    # Version v serves weights that differ from every other version's: recorded log-probs
    # then say which weights served a call.
    versions = {0: policy, **{v: perturbed(policy, 0.3, seed=v) for v in range(1, 6)}}

    done = threading.Event()
    lock = threading.Lock()
    completed: list[str] = []
    failures: list[str] = []

    def agent(k: int) -> None:
        rollout_id = f"load-{k}-{uuid.uuid4().hex[:6]}"
        client.create_rollouts([RolloutCreate(rollout_id=rollout_id, input={})])
        base = f"{vllm_gateway.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1"
        # Paused Gateway: 429 + Retry-After, which the official client honours and retries.
        llm = openai.OpenAI(base_url=base, api_key=vllm_gateway.key, max_retries=50, timeout=120)
        i = 0
        while not done.is_set():
            messages = PROMPTS[(k + i) % len(PROMPTS)]
            try:
                llm.chat.completions.create(model="m", messages=messages, max_tokens=12)  # type: ignore[arg-type]
                with lock:
                    completed.append(rollout_id)
            except Exception as exc:
                with lock:
                    failures.append(repr(exc))
            i += 1

    threads = [threading.Thread(target=agent, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()

    def wait_for_calls(n: int) -> None:
        """Until n more calls have completed (after a publish: on the new version)."""
        with lock:
            target = len(completed) + n
        while True:
            with lock:
                if len(completed) >= target or failures:
                    return
            done.wait(0.05)

    try:
        wait_for_calls(4)
        for version in range(1, 6):
            folder = tmp_path / f"v{version}"

            def publish(model: Any = versions[version], folder: Path = folder) -> None:
                save_weights(model, folder)
                reload_weights(vllm_server.base_url, folder)
                reset_prefix_cache(vllm_server.base_url)

            publisher.update(publish, version)
            wait_for_calls(4)
    finally:
        done.set()
        for t in threads:
            t.join(180)
    assert not failures, failures[:3]

    events = [
        e
        for rollout_id in sorted(set(completed))
        for e in client.get_events_json(rollout_id, format="raw", attempt_id="a1")
        if e["event_type"] == "model_request"
    ]
    assert len(events) == len(completed) and all(e["data"]["status"] == "ok" for e in events)
    seen: set[int] = set()
    for event in events:
        data = event["data"]
        version = data["server"]["version"]
        seen.add(version)
        choice = data["response"]["choices"][0]
        got = [c["logprob"] for c in choice["logprobs"]["content"]]
        prompt, response = data["response"]["prompt_token_ids"], choice["token_ids"]
        # The recorded version's weights reproduce vLLM's log-probs; its neighbours' (the versions
        # a mislabelled call would really have been served by) do not.
        near = [v for v in (version - 1, version, version + 1) if v in versions]
        diffs = {
            v: mismatch([got], [policy_log_probs(versions[v], prompt, response)])["mean_abs"] for v in near
        }
        assert diffs[version] < 1e-4, (version, diffs)
        assert min(d for v, d in diffs.items() if v != version) > 10 * max(diffs[version], 1e-6), (
            version,
            diffs,
        )
    assert seen == set(range(6))
    client.close()
