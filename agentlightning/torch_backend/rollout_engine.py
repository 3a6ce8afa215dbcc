"""The seam between the torch backend and what serves its rollouts.

A `RolloutEngine` serves the policy as OpenAI endpoints (`start`), takes new weights while the
Gateway is paused and drained (`publish`) and stops (`close`). Two implement it: the built-in
torch engine (`TorchRolloutEngine`, in this process) and real vLLM servers (`VLLMEngine`,
child processes). `open_rollout_engine` picks one for `actor_rollout_ref.rollout.engine`; the
backend then never asks which it has.

What is served is the trained model itself, or with LoRA its PeftModel: each engine decides
what to move on a publish (full weights, or only the adapter).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Protocol

import torch

from agentlightning.log import get_logger
from agentlightning.torch_backend.config import TorchRolloutConfig
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.lora import adapter_state
from agentlightning.torch_backend.models import resolve_dtype
from agentlightning.torch_backend.openai_backend import InferenceServer
from agentlightning.torch_backend.vllm_engine import (
    VLLMEngine,
    VLLMEngineError,
    check_servable,
    choose_engine,
    server_config,
)
from agentlightning.trainer import ConfigError

log = get_logger("torch_backend")


class RolloutEngine(Protocol):
    def start(self, policy: Any) -> list[str]:
        """Serve `policy` (with LoRA: the PeftModel); returns the OpenAI endpoints to register."""
        ...

    def publish(self, policy: Any, version: int) -> object:
        """Serve `policy`'s current weights as `version` (the Gateway is paused and drained)."""
        ...

    def close(self) -> None: ...


class TorchRolloutEngine:
    """The built-in engine: a serving copy of the policy behind the inference server, in-process."""

    def __init__(
        self,
        tokenizer: Any,
        served_model_name: str,
        rollout: TorchRolloutConfig,
        device: torch.device,
        version: int = 0,
        seed: int = 0,
        lora: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.rollout = rollout
        self.dtype = resolve_dtype(rollout.dtype, device)
        self.version = version
        self.seed = seed
        self.lora = lora  # the serving copy has the policy's base: a publish moves only the adapter
        self.engine: TorchEngine | None = None
        self.server: InferenceServer | None = None

    def start(self, policy: Any) -> list[str]:
        model = policy.get_base_model() if self.lora else policy
        rollout = self.rollout
        self.engine = TorchEngine(
            copy.deepcopy(model).to(dtype=self.dtype),
            self.tokenizer,
            max_num_seqs=rollout.max_num_seqs,
            max_model_len=rollout.max_model_len,
            max_num_batched_tokens=rollout.max_num_batched_tokens,
            seed=self.seed,
            version=self.version,
        )
        self.server = InferenceServer(self.engine, self.served_model_name, rollout.host, rollout.port).start()
        return [self.server.base_url]

    def publish(self, policy: Any, version: int) -> int:
        assert self.engine is not None, "start() first"
        if self.lora:
            return self.engine.publish(adapter_state(policy.get_base_model()), version, partial=True)
        return self.engine.publish(policy, version)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def open_rollout_engine(
    rollout: TorchRolloutConfig,
    *,
    model_path: str,
    model: Any,
    tokenizer: Any,
    served_model_name: str,
    device: torch.device,
    workdir: Path,
    version: int,
    step: int,
    lora_rank: int,
) -> RolloutEngine:
    """The engine `rollout.engine` asks for (`auto`: see `choose_engine`), not yet started."""
    name, why = choose_engine(rollout.engine, model_path, model, rollout)
    log.info("rollout_engine", engine=name, reason=why)
    if name == "vllm":
        try:
            check_servable(model)
        except VLLMEngineError as exc:
            raise ConfigError(f"actor_rollout_ref.rollout.engine=vllm: {exc}") from None
        return VLLMEngine(
            tokenizer,
            served_model_name,
            server_config(rollout, device),
            workdir,
            num_servers=rollout.vllm.num_servers,
            version=version,
            lora_rank=lora_rank,
        )
    return TorchRolloutEngine(
        tokenizer,
        served_model_name,
        rollout,
        device,
        version=version,
        seed=rollout.seed + step,
        lora=lora_rank > 0,
    )
