"""Run as a script: the `agl-sft backend=verl` command — verl's own SFT trainer
(`agentlightning/verl/sft.py`) — on CPU, in this process, with the test-only CPU platform
(`cpu_platform.py`) set up first. verl's engine is set for the CPU through agl-sft's own
`verl_overrides`.

    python -m tests.verl.cpu_sft [agl-sft key=value ...]
"""

from __future__ import annotations

import sys

import torch

from tests.verl.cpu_platform import init_single_process

# verl's FSDP2 engine in fp32 on CPU, without flash-attn, remove-padding or torch.compile
# (cpu_platform.CPU_ACTOR_OVERRIDES, in the keys of verl's SFT config).
CPU_SFT_OVERRIDES = [
    "engine.strategy=fsdp2",
    "engine.model_dtype=fp32",
    "engine.dtype=float32",
    "+engine.mixed_precision.param_dtype=fp32",  # bf16 by default
    "engine.use_torch_compile=false",
    "model.use_remove_padding=false",
    "model.enable_gradient_checkpointing=false",
    "+model.override_config.attn_implementation=sdpa",
]


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    init_single_process()  # the process group the command then finds, on the CPU platform
    from agentlightning.commands.backends import sft_main

    return sft_main(["backend=verl", *argv, f"verl_overrides=[{','.join(CPU_SFT_OVERRIDES)}]"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
