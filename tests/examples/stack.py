"""Run an example's real agent through a real Gateway and Controller against the scripted model,
and read back what the trainer core makes of it. Used by the example tests, the doctor's tests and
`bench/merge_report.py`; it needs the repository's `examples/` and `.venv-examples`.

The agent runs in its own interpreter (`.venv-examples/bin/python`, the frameworks without
torch), started by a real `agl-controller` (local runner) for rollouts created on a real
`agl-server`; the Gateway forwards the agent's calls to a `ScriptedChatModel`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning.aggregation import AggregationStats, aggregate_rollout, usable_calls
from agentlightning.client import GatewayClient
from agentlightning.launch import Service, start_controller, start_gateway
from agentlightning.rows import TrainingRow
from agentlightning.schemas import Model
from tests.fakes.scripted_model import Policy, ScriptedChatModel, decode

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
EXAMPLES_PYTHON = REPO / ".venv-examples" / "bin" / "python"
KEY = "examples-test-key"
TERMINAL = ("succeeded", "failed")


@dataclass
class RolloutResult:
    rollout_id: str
    state: str
    error: str | None
    events: list[dict[str, Any]]  # raw events (model_request, reward, ...)
    triplets: list[dict[str, Any]]  # the same in the triplet view
    rows: list[TrainingRow]
    stats: AggregationStats
    log: str  # the agent's output

    @property
    def model_requests(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event_type"] == "model_request"]

    @property
    def rewards(self) -> list[float]:
        return [float(e["data"]["value"]) for e in self.events if e["event_type"] == "reward"]

    def prompt_text(self, call: int) -> str:
        return decode(self.model_requests[call]["data"]["response"]["prompt_token_ids"])

    def merge_break(self) -> str | None:
        return first_merge_break([t for t in self.triplets if t.get("event_type") == "model_request"])


@dataclass
class Stack:
    gateway: Service
    controller: Service
    model: ScriptedChatModel
    client: GatewayClient
    url: str
    work: Path
    results: list[RolloutResult] = field(default_factory=list)

    def run(
        self,
        agent: str | list[str],
        env_map: dict[str, str],
        inputs: Sequence[dict[str, Any]],
        timeout: float = 240.0,
        is_train: bool = True,
    ) -> list[RolloutResult]:
        """Create one rollout per input, wait for all, return what each recorded. `agent`: a
        Python class (module:Class), or an agent in any language as its argv."""
        local = {"command": agent} if isinstance(agent, list) else {"agent_class": agent}
        specs = [
            {
                "input": data,
                "is_train": is_train,
                "config": {
                    "timeout_seconds": timeout,
                    "local": {**local, "env_map": env_map},
                },
            }
            for data in inputs
        ]
        rollouts = self.client.create_rollouts(specs)
        ids = [r.rollout_id for r in rollouts]
        deadline = time.monotonic() + timeout + 60
        while True:
            states = {i: self.client.get_rollout(i).rollout for i in ids}
            if all(r.status.state.value in TERMINAL for r in states.values()):
                break
            if not self.controller.alive():
                raise AssertionError(f"the controller exited:\n{self.controller.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"rollouts did not finish: { {i: r.status.state.value for i, r in states.items()} }"
                )
            time.sleep(0.2)
        out = []
        for rid in ids:
            rollout = states[rid]
            events = self.client.get_events_json(rid, format="raw")
            triplets = self.client.get_events_json(rid, format="triplet")
            rewards = [t["data"]["value"] for t in triplets if t.get("event_type") == "reward"]
            stats = AggregationStats()
            rows = aggregate_rollout(triplets, rid, "g", float(rewards[-1]) if rewards else 0.0, stats=stats)
            out.append(
                RolloutResult(
                    rid,
                    rollout.status.state.value,
                    rollout.status.error_message,
                    events,
                    triplets,
                    rows,
                    stats,
                    agent_log(self.work / "agents", rid),
                )
            )
        self.results += out
        return out


def agent_log(log_dir: Path, rollout_id: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob(f"{rollout_id}*/*.log")))


@contextmanager
def example_stack(
    policy: Policy,
    example: str,
    work: Path,
    *controller_overrides: str,
    maximum_size: int = 2,
    agent_env: dict[str, str] | None = None,
    scale_out: bool = False,
) -> Iterator[Stack]:
    """Scripted model, Gateway and Controller (agents in `examples/{example}` run by .venv-examples).
    `agent_env`: extra environment of the Controller, which its agents inherit."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with ScriptedChatModel(policy, scale_out=scale_out, streams=True) as model, ExitStack() as services:
        gateway = services.enter_context(
            start_gateway(
                "long_poll_max_seconds=2",
                key=KEY,
                store_url=f"sqlite:///{work / 'gateway.db'}",
                log_level="warning",
                log_path=work / "gateway.log",
                env=env,
                stop_grace=20,
            )
        )
        url = gateway.url
        client = GatewayClient(url, KEY)
        client.register_models([Model(model="policy", endpoint=model.base_url)])
        controller = services.enter_context(
            start_controller(
                url,
                f"local_runner.python={EXAMPLES_PYTHON}",
                f"local_runner.cwd={EXAMPLES / example}",
                "local_runner.preload_timeout=300",
                "shutdown_timeout=10",
                *controller_overrides,
                runner_type="local",
                key=KEY,
                log_dir=work / "agents",
                max_agents=maximum_size,
                log_level="warning",
                log_path=work / "controller.log",
                env={**env, **(agent_env or {})},
                stop_grace=20,
            )
        )
        yield Stack(gateway, controller, model, client, url, work)
        client.close()


# --- why a rollout's calls did not merge ----------------------------------------------------------


def _snippet(ids: list[int], at: int, width: int = 8) -> str:
    return repr(decode(ids[at : at + width]))


def first_merge_break(calls: list[dict[str, Any]]) -> str | None:
    """Where trajectory aggregation first had to open a new row, and why, in words; None if all merged.

    Same walk as the trainer core (`agentlightning.aggregation`): a call extends the row
    when its prompt begins with the row's tokens so far (previous prompt + response)."""
    usable = usable_calls(calls, AggregationStats())
    if not usable:
        return None
    seq = list(usable[0].prompt_ids)
    first_prompt_len = len(seq)
    generated = [(len(seq), len(seq) + len(usable[0].response_ids))]  # spans the model wrote
    seq += usable[0].response_ids
    for n, call in enumerate(usable[1:], start=2):
        prompt = list(call.prompt_ids)
        if prompt[: len(seq)] == seq:
            generated.append((len(prompt), len(prompt) + len(call.response_ids)))
            seq = [*prompt, *call.response_ids]
            continue
        pairs = zip(seq, prompt, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(seq), len(prompt)))
        previous_text, prompt_text = decode(seq), decode(prompt)
        if "# Tools" in previous_text and "# Tools" not in prompt_text:
            why = f"call {n} was sent without `tools`, so the chat template renders another system prompt"
        elif "# Tools" not in previous_text and "# Tools" in prompt_text:
            why = f"call {n} was sent with `tools` where the previous one had none"
        elif at >= len(prompt):
            why = f"call {n}'s prompt is shorter than the conversation so far (history dropped or trimmed)"
        elif at < first_prompt_len:
            why = f"call {n} re-sends the first prompt differently"
        elif any(start <= at < end for start, end in generated):
            why = (
                f"call {n}'s prompt re-renders an earlier model turn differently from how the model wrote it"
            )
        else:
            why = f"call {n} re-sends a tool result or user turn differently"
        return f"{why}: at token {at} the row has {_snippet(seq, at)}, the new prompt {_snippet(prompt, at)}"
    return None
