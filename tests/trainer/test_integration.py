"""The trainer core end to end: a real Gateway process with its model proxy, a scripted
vLLM-shaped model server, and a multi-turn tool-calling agent that uses the official openai
SDK against the proxy and posts its reward, as agents do in production. The test plays the
controller (it starts each agent and reports its state)."""

from __future__ import annotations

import ast
import json
import operator
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentlightning.client import GatewayClient
from agentlightning.rewards import to_float32
from agentlightning.schemas import Rollout, RolloutState
from agentlightning.trainer.advantage import group_advantages
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import RolloutManager
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import (
    END,
    ROLE_TOKENS,
    FakeModelServer,
    Reply,
    ToolCall,
    chat_prompt_ids,
    encode,
    render_message,
    token_logprob,
    tool_call_tokens,
)

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "integration-key"
SYSTEM = {"role": "system", "content": "use the tools"}
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("calc", "verify")
]
QUESTIONS = {"what is six times seven": ("6*7", 42), "what is two plus three": ("2+3", 5)}
OPS = {ast.Mult: operator.mul, ast.Add: operator.add}


def _calc(expr: str) -> int:
    node = ast.parse(expr, mode="eval").body
    assert isinstance(node, ast.BinOp)
    return OPS[type(node.op)](node.left.value, node.right.value)  # type: ignore[attr-defined]


def script_model(fake: FakeModelServer, question: str, right: int, wrong: int) -> None:
    """Three calls per rollout: calc, verify, answer — one rollout of the two answers right."""
    expr, value = QUESTIONS[question]
    fake.script(
        Reply(content="", tool_calls=[ToolCall("calc", json.dumps({"expr": expr}))], when=question, times=2),
        Reply(
            content="",
            tool_calls=[ToolCall("verify", json.dumps({"value": value}))],
            when=f"result={value}",
            times=2,
        ),
        Reply(content=f"the answer is {right}", when=f"verified {value}"),
        Reply(content=f"the answer is {wrong}", when=f"verified {value}"),
    )


def run_agent(gw: RunningGateway, rollout: Rollout, attempt_id: str, log: dict[str, Any]) -> None:
    """A plain tool-calling loop with the openai SDK, like a user's agent."""
    base = f"{gw.url}/proxy/rollout/{rollout.rollout_id}/attempt/{attempt_id}/mode/train/openai/v1"
    llm = openai.OpenAI(base_url=base, api_key=KEY, max_retries=8)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": rollout.input["question"]}]
    calls: list[list[dict[str, Any]]] = []
    for _ in range(5):
        calls.append(list(messages))
        sent = cast(list[ChatCompletionMessageParam], messages)  # the JSON the SDK sends
        message = llm.chat.completions.create(model="gpt-4o", messages=sent, tools=TOOLS).choices[0].message
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            assistant["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        messages.append(assistant)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            assert call.type == "function"
            args = json.loads(call.function.arguments)
            output = (
                f"result={_calc(args['expr'])}"
                if call.function.name == "calc"
                else f"verified {args['value']}"
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    answer = messages[-1]["content"]
    expected = QUESTIONS[rollout.input["question"]][1]
    reward = 1.0 if answer.endswith(f" {expected}") else 0.0
    httpx.post(
        f"{gw.url}/api/rollouts/{rollout.rollout_id}/attempt/{attempt_id}/events",
        json={"event_type": "reward", "data": {"value": reward}},
        headers={"Authorization": f"Bearer {KEY}"},
    ).raise_for_status()
    log[rollout.rollout_id] = {"messages": messages, "calls": calls, "reward": reward}


class Controller:
    """Starts an agent for every queued rollout, reports running / succeeded / failed."""

    def __init__(self, gw: RunningGateway) -> None:
        self.gw = gw
        self.client = GatewayClient(gw.url, KEY)
        self.log: dict[str, Any] = {}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(4)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Controller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pool.shutdown(wait=True)
        self.client.close()
        if self.errors:
            raise self.errors[0]

    def _loop(self) -> None:
        seen: set[str] = set()
        while not self._stop.is_set():
            for rollout in self.client.long_poll_rollouts([RolloutState.QUEUING], wait_seconds=0.5).value:
                if rollout.rollout_id not in seen:
                    seen.add(rollout.rollout_id)
                    self._pool.submit(self._run, rollout)

    def _run(self, rollout: Rollout) -> None:
        self.client.patch_rollout(rollout.rollout_id, state=RolloutState.RUNNING, last_attempt_id="a1")
        try:
            run_agent(self.gw, rollout, "a1", self.log)
        except BaseException as exc:
            self.errors.append(exc)
            self.client.patch_rollout(rollout.rollout_id, state=RolloutState.FAILED, error_message=repr(exc))
        else:
            self.client.patch_rollout(rollout.rollout_id, state=RolloutState.SUCCEEDED)


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def gw(tmp_path) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, KEY, "proxy.backoff_seconds=0.01", "proxy.max_backoff_seconds=0.02")
    yield gateway
    gateway.process.stop()


def _config(gw: RunningGateway, **agl: Any):
    return load_core_config(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2}},
            "agentlightning": {
                "agl_base_url": gw.url,
                "agl_key": KEY,
                "poll_wait_seconds": 5,
                "async_rollout": {"pause_retry_after_seconds": 0.1, "drain_timeout_seconds": 30},
                **agl,
            },
        }
    )


def expected_row(calls: list[list[dict[str, Any]]], messages: list[dict[str, Any]]) -> dict[str, list]:
    """The trajectory row of a conversation, from the model's tokenizer and chat template alone."""
    answers: list[list[int]] = []
    contexts: list[list[int]] = []
    for k, prompt_messages in enumerate(calls):
        assistant = messages[len(prompt_messages)]
        answer = encode(assistant["content"])
        for call in assistant.get("tool_calls", []):
            answer += tool_call_tokens(call["function"]["name"], call["function"]["arguments"])
        answers.append([*answer, END])
        if k + 1 < len(calls):
            between = messages[len(prompt_messages) + 1 : len(calls[k + 1])]
            contexts.append([t for m in between for t in render_message(m)] + [ROLE_TOKENS["assistant"]])
    response, mask, log_probs = [], [], []
    for k, answer in enumerate(answers):
        response += answer
        mask += [1] * len(answer)
        log_probs += [token_logprob(t, p) for p, t in enumerate(answer)]
        if k < len(contexts):
            response += contexts[k]
            mask += [0] * len(contexts[k])
            log_probs += [0.0] * len(contexts[k])
    return {"prompt": chat_prompt_ids(calls[0]), "response": response, "mask": mask, "log_probs": log_probs}


def test_tool_calling_rollouts_become_the_expected_rows(gw: RunningGateway, fake: FakeModelServer) -> None:
    cfg = _config(gw, keep_last_rollouts=0)
    for question, (_, value) in QUESTIONS.items():
        script_model(fake, question, right=value, wrong=value - 1)
    with RolloutManager(cfg) as manager, Controller(gw) as controller:
        manager.register_endpoints([fake.base_url], version=0)
        rollouts, _ = manager.collect([{"question": q} for q in QUESTIONS], step=0)
        assert manager.flush_deletions() == 4
    assert len(rollouts) == 4 and not any(r.failed for r in rollouts)

    batch = build_training_batch(rollouts, cfg, step=0, policy_version=0)
    assert batch.metrics["training/n_trace_merge_mismatch"] == 0
    assert batch.metrics["training/n_turns"] == 12 and batch.metrics["training/n_calls_error"] == 0
    assert len(batch.rows) == 4  # three calls each, merged into one row per rollout
    for row in batch.rows:
        log = controller.log[row.rollout_id]
        assert len(log["calls"]) == 3
        exp = expected_row(log["calls"], log["messages"])
        assert row.prompt_ids == exp["prompt"]
        assert row.response_ids == exp["response"]
        assert row.response_mask == exp["mask"]
        assert row.rollout_log_probs == pytest.approx(exp["log_probs"], abs=1e-6)
        assert row.model_versions == [0 if m else -1 for m in exp["mask"]]
        assert row.reward == to_float32(log["reward"])
    # each group: one right, one wrong answer -> advantages ±0.707 (GRPO, sample std)
    for group_id in {r.group_id for r in batch.rows}:
        members = [r for r in batch.rows if r.group_id == group_id]
        assert sorted(r.reward for r in members) == [0.0, 1.0]
        assert sorted(r.advantage for r in members) == pytest.approx(sorted(group_advantages([0.0, 1.0])))
    (minibatch,) = batch.minibatches()
    assert sum(r.loss_weight * r.n_trainable for r in minibatch) == pytest.approx(1.0)
    assert batch.metrics["training/staleness/max"] == 0


def test_weight_update_drains_in_flight_calls_and_later_calls_carry_the_new_version(
    gw: RunningGateway, fake: FakeModelServer
) -> None:
    cfg = _config(gw, keep_partial_minibatch=True)  # a single group still trains
    question = "what is six times seven"
    expr, value = QUESTIONS[question]
    fake.script(
        Reply(
            content="", tool_calls=[ToolCall("calc", json.dumps({"expr": expr}))], when=question, gate="hold"
        ),
        Reply(
            content="", tool_calls=[ToolCall("verify", json.dumps({"value": value}))], when=f"result={value}"
        ),
        Reply(content=f"the answer is {value}", when=f"verified {value}"),
    )
    seen_at_publish: dict[str, Any] = {}
    with RolloutManager(cfg) as manager, Controller(gw) as controller:
        manager.register_endpoints([fake.base_url], version=0)
        (group,) = manager.submit([{"question": question}], step=0, n=1)
        fake.state.wait_active(1)  # the agent's first call is inside the model server, held

        def publish() -> None:
            seen_at_publish["model_calls_active"] = fake.state.active
            seen_at_publish["inflight"] = manager.client.proxy_state().inflight
            return None

        opener = threading.Timer(0.3, fake.state.open_gate, args=("hold",))
        opener.start()
        started = time.monotonic()
        metrics = manager.update_weights(publish, version=1)
        assert time.monotonic() - started >= 0.25  # it waited for the held call
        assert manager.wait(lambda: manager.is_done(group.rollout_ids[0]), timeout=60)
        (rollout,) = manager.take(group.rollout_ids)
        opener.join()
        assert not manager.client.proxy_state().paused
    assert seen_at_publish == {"model_calls_active": 0, "inflight": 0}
    assert metrics["training/async/proxy_inflight_at_pause"] == 1
    assert metrics["training/async/proxy_drain_timed_out"] == 0
    assert not rollout.failed and controller.log[rollout.rollout_id]["reward"] == 1.0

    batch = build_training_batch([rollout], cfg, step=1, policy_version=manager.policy_version)
    (row,) = batch.rows
    log = controller.log[rollout.rollout_id]
    exp = expected_row(log["calls"], log["messages"])
    assert row.response_ids == exp["response"]  # calls refused while paused were retried, none lost
    first_answer = len(tool_call_tokens("calc", json.dumps({"expr": expr}))) + 1
    trainable_versions = [v for v, m in zip(row.model_versions, row.response_mask, strict=True) if m]
    assert trainable_versions == [0] * first_answer + [1] * (len(trainable_versions) - first_answer)
    assert batch.metrics["training/policy_version"] == 1
    assert batch.metrics["training/staleness/max"] == 1
    assert 0 < batch.metrics["training/staleness/frac_stale_tokens"] < 1
