"""Test-only: a CPU "platform" for verl 0.9.1, which ships none (it falls back to CUDA).

Registered before `verl.workers.*` is imported, it lets verl's FSDP2 engine run on CPU with gloo
in this process. It leans on verl internals (the platform plug-in, the device-module calls the
engine makes) and is fragile by nature: never use it outside tests.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.plugin.platform.platform_cuda import PlatformCUDA
from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform


class _CpuDeviceModule:
    """Stands in for `torch.cuda` where verl calls it: no-ops, host RNG, no memory figures."""

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, *args: Any) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, *args: Any) -> None:
        torch.set_rng_state(state)

    def get_device_name(self, *args: Any) -> str:
        return "cpu"

    def mem_get_info(self, *args: Any) -> tuple[int, int]:
        return (1 << 34, 1 << 34)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0


@PlatformRegistry.register(platform="agl_test_cpu")
class PlatformCPU(PlatformCUDA):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _CpuDeviceModule()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> Any:
        return torch.device("cpu")  # verl moves modules `.to(device=current_device())`

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def empty_cache(self) -> None:
        pass

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def ray_resource_name(self) -> str:
        return "CPU"


def use_cpu_platform() -> None:
    set_platform(PlatformCPU())


# verl's FSDP2 actor in fp32 on CPU, without flash-attn, remove-padding or torch.compile.
CPU_ACTOR_OVERRIDES = [
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",  # bf16 by default
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "trainer.n_gpus_per_node=1",
]


def init_single_process() -> None:
    """This process as the one rank of a gloo process group, on the CPU platform (before any
    `verl.workers` import), as verl's Ray worker would set itself up on a GPU."""
    import os

    from agentlightning.procs import free_port

    use_cpu_platform()
    os.environ.update(
        VERL_ENGINE_DEVICE="cuda",  # pick verl's FSDP engine class; it runs on the CPU platform
        VERL_ENGINE_VENDOR="nvidia",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
