"""The torch backend's rollouts served by real vLLM: N vLLM servers and weight publishing.

`start()` saves the policy (Hugging Face layout, with its tokenizer) to `{workdir}/weights/base`
and starts the servers on it; `publish(model, version)` — called by the trainer core while
the Gateway is paused and drained — writes the new weights as safetensors to
`{workdir}/weights/v{version}`, has every server reload them and reset its prefix cache, and
deletes the previous version's folder. The Gateway then registers the same endpoints with the
new version and resumes.

With LoRA (`actor_rollout_ref.model.lora_rank > 0`, `lora.py`) the servers run the frozen base
(served as `{name}-base`) with `--enable-lora`, and the adapter is what moves: `start()` and
every `publish()` write the adapter in peft's layout to `{workdir}/adapters/v{version}` and each
server swaps it in (`/v1/unload_lora_adapter`, `/v1/load_lora_adapter`) under the Gateway's
model name, so agents' calls reach base + adapter; a publish ships megabytes, not the model.

Memory on one GPU: vLLM takes `gpu_memory_utilization` of the device (weights + KV cache) and
the policy update uses the rest; vLLM's sleep mode (which would free its share during the
update) does nothing on CPU and is not used, so size `gpu_memory_utilization` to leave room
for the policy, its gradients and optimizer state.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch

from agentlightning.log import get_logger
from agentlightning.torch_backend.config import TorchRolloutConfig
from agentlightning.torch_backend.lora import base_state, save_adapter
from agentlightning.torch_backend.models import is_builtin
from agentlightning.torch_backend.vllm_server import (
    VLLMServerConfig,
    VLLMServers,
    save_state,
    save_weights,
    vllm_unavailable,
)

log = get_logger("vllm_engine")

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class VLLMEngineError(RuntimeError):
    pass


def server_config(rollout: TorchRolloutConfig, device: torch.device) -> VLLMServerConfig:
    """How to start each vLLM server, from `actor_rollout_ref.rollout.*` (the same keys as the
    torch engine where they mean the same: dtype, lengths, batch limits, host, seed)."""
    v = rollout.vllm
    dtype = rollout.dtype if rollout.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    return VLLMServerConfig(
        python=v.python,
        dtype=dtype,
        max_model_len=rollout.max_model_len,
        max_num_seqs=rollout.max_num_seqs,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        kv_cache_memory_bytes=v.kv_cache_memory_bytes if device.type != "cuda" else None,
        gpu_memory_utilization=v.gpu_memory_utilization,
        enforce_eager=v.enforce_eager,
        tool_call_parser=v.tool_call_parser,
        host=rollout.host,
        seed=rollout.seed,
        start_timeout_seconds=v.start_timeout_seconds,
        cpu_binds=list(v.cpu_binds),
        engine_core_beside_worker=v.engine_core_beside_worker,
        extra_args=list(v.extra_args),
    )


def check_servable(model: Any) -> None:
    """vLLM-specific limits of a model, named before minutes are spent starting servers."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    if head_dim is not None and head_dim < 32:
        raise VLLMEngineError(
            f"vLLM's CPU attention needs a head size of at least 32, this model has {head_dim} "
            "(hidden_size / num_attention_heads); use actor_rollout_ref.rollout.engine=torch"
        )


def choose_engine(
    requested: str, model_path: str, model: Any, rollout: TorchRolloutConfig
) -> tuple[str, str]:
    """(engine, why) for `actor_rollout_ref.rollout.engine`: `torch` and `vllm` are kept as
    asked; `auto` picks vLLM for a model at least `vllm.auto_min_parameters` large that vLLM can
    serve, where vLLM is installed — below that size our engine is faster (docs/vllm.md)."""
    if requested != "auto":
        return requested, "asked for"
    if is_builtin(model_path):
        return "torch", "a built-in model (built in code, tiny)"
    n_params = sum(p.numel() for p in model.parameters())
    if n_params < rollout.vllm.auto_min_parameters:
        return "torch", (
            f"{n_params / 1e6:.1f}M parameters < vllm.auto_min_parameters "
            f"({rollout.vllm.auto_min_parameters / 1e6:.0f}M): the torch engine is as fast there, starts faster and uses less memory"
        )
    try:
        check_servable(model)
    except VLLMEngineError as exc:
        return "torch", f"vLLM cannot serve this model: {exc}"
    missing = vllm_unavailable(rollout.vllm.python)
    if missing is not None:
        return "torch", f"vLLM is not installed: {missing}"
    return "vllm", f"{n_params / 1e6:.0f}M parameters, vLLM installed"


class VLLMEngine:
    """Real vLLM servers serving the policy, kept up to date by `publish` (a `RolloutEngine`)."""

    def __init__(
        self,
        tokenizer: Any,
        served_model_name: str,
        config: VLLMServerConfig,
        workdir: str | Path,
        num_servers: int = 1,
        version: int = 0,
        lora_rank: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.lora = lora_rank > 0  # serve the base and swap a LoRA adapter (publish: a PeftModel)
        self.config = dataclasses.replace(config, max_lora_rank=lora_rank) if self.lora else config
        self.workdir = Path(workdir)
        self.num_servers = num_servers
        self.version = version
        self.dtype = {v: k for k, v in DTYPE_NAMES.items()}.get(config.dtype)
        self.servers: VLLMServers | None = None
        self._current: Path | None = None
        self.untie = False

    @property
    def weights_dir(self) -> Path:
        return self.workdir / "weights"

    @property
    def endpoints(self) -> list[str]:
        return self.servers.endpoints if self.servers is not None else []

    @property
    def adapters_dir(self) -> Path:
        return self.workdir / "adapters"

    def start(self, model: Any) -> list[str]:
        """Save `model` and start the servers on it; returns their OpenAI endpoints. With LoRA,
        `model` is the PeftModel: its base is served and its adapter loaded as the model."""
        if self.lora:
            peft_model, model = model, model.get_base_model()
        check_servable(model)
        base = self.weights_dir / "base"
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        # A tied output head is served untied (its own copy, rewritten on every publish): after a
        # weight reload vLLM leaves a tied head stale (`ParallelLMHead: Failed to load weights`).
        self.untie = bool(getattr(model.config, "tie_word_embeddings", False))
        config = copy.deepcopy(model.config)
        config.tie_word_embeddings = False
        config.save_pretrained(base)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(base)
        self.tokenizer.save_pretrained(base)
        if self.lora:
            save_state(base_state(model).items(), base, self.dtype, untie=self.untie)
        else:
            save_weights(model, base, self.dtype, untie=self.untie)
        name = f"{self.served_model_name}-base" if self.lora else self.served_model_name
        self.servers = VLLMServers(base, name, self.config, self.workdir / "servers", self.num_servers)
        self.servers.start()
        if self.lora:  # the adapter as it is now (fresh, or resumed from a checkpoint)
            self._swap_adapter(peft_model, self.version, replace=False)
        log.info(
            "vllm_engine_started",
            endpoints=self.servers.endpoints,
            pids=self.servers.pids,
            version=self.version,
            dtype=self.config.dtype,
        )
        return self.servers.endpoints

    def publish(self, model: Any, version: int) -> float:
        """Put `model`'s weights (with LoRA: the PeftModel's adapter) into every server (the Gateway
        is paused and drained meanwhile). Returns the seconds the reload itself took (saving excluded)."""
        if self.servers is None:
            raise VLLMEngineError("publish before start")
        self.servers.check_alive()
        if self.lora:
            return self._swap_adapter(model, version)
        folder = self.weights_dir / f"v{version}"
        with torch.no_grad():
            save_weights(model, folder, self.dtype, untie=self.untie)
        seconds = self.servers.reload(folder)
        previous, self._current = self._current, folder
        if previous is not None and previous != folder:
            shutil.rmtree(previous, ignore_errors=True)
        self.version = version
        log.info("vllm_weights_published", version=version, reload_seconds=round(seconds, 3))
        return seconds

    def _swap_adapter(self, peft_model: Any, version: int, replace: bool = True) -> float:
        assert self.servers is not None
        folder = save_adapter(peft_model, self.adapters_dir / f"v{version}")
        seconds = self.servers.swap_adapter(self.served_model_name, folder, replace=replace)
        previous, self._current = self._current, folder
        if previous is not None and previous != folder:
            shutil.rmtree(previous, ignore_errors=True)
        self.version = version
        log.info(
            "vllm_adapter_published", version=version, load_seconds=round(seconds, 3), folder=str(folder)
        )
        return seconds

    def close(self) -> None:
        if self.servers is not None:
            self.servers.stop()
