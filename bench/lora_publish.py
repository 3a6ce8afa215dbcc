"""Publish cost, LoRA vs full weights, side by side in one run: seconds and bytes moved.

For each model — the demo's (vLLM's recipe: 2 heads of 32, untied) and a ~120M-parameter Qwen2
built in code with random weights (hidden 768, 12 layers) — the same policy is published both
ways, `--reps` times each (median reported):

* torch engine (in process): full = `TorchEngine.publish(model)` (every tensor copied in);
  LoRA = `TorchEngine.publish(adapter_state(model), partial=True)` (the adapter's tensors only).
  Bytes: the tensors handed over.
* vLLM (`--engines torch,vllm`, needs .venv-vllm; one server per model, started with
  --enable-lora): full = save the safetensors + `reload_weights` + prefix-cache reset, what
  `VLLMEngine.publish` does; LoRA = save the adapter (peft layout) + unload/load the adapter +
  prefix-cache reset. Bytes: the folder written and read back.

The LoRA adapter is rank `--rank` (alpha 2·rank) on every linear layer but the output head
(`target_modules: all-linear`). Prints one line per (model, engine, way) and the full/LoRA ratios.

    .venv/bin/python bench/lora_publish.py                       # torch engine, both models
    .venv/bin/python bench/lora_publish.py --engines torch,vllm  # and real vLLM
    .venv/bin/python bench/lora_publish.py --smoke               # the demo's model, torch, once
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentlightning.log import configure_logging
from agentlightning.tiny_model import build_model, build_tokenizer
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.lora import (
    adapter_state,
    apply_lora,
    base_state,
    lora_settings,
    save_adapter,
)
from agentlightning.torch_backend.vllm_server import VLLMServerConfig, VLLMServers, save_state
from bench.model_sizes import SIZES
from bench.model_sizes import size as model_size


def tensor_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def median_seconds(fn: Callable[[int], None], reps: int) -> float:
    times = []
    for i in range(reps):
        started = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def nudge(model: Any, i: int) -> None:
    """New adapter values for publish number `i` (what an update would have changed)."""
    with torch.no_grad():
        for t in adapter_state(model).values():
            t.add_(1e-3 * (i + 1))


def bench_torch(model: Any, tokenizer: Any, reps: int) -> dict[str, tuple[float, int]]:
    engine = TorchEngine(copy.deepcopy(model), tokenizer)
    try:
        full = model.state_dict()

        def full_publish(i: int) -> None:
            nudge(model, i)
            engine.publish(model)

        def adapter_publish(i: int) -> None:
            nudge(model, i)
            engine.publish(adapter_state(model), partial=True)

        full_s = median_seconds(full_publish, reps)
        adapter_s = median_seconds(adapter_publish, reps)
        return {"full": (full_s, tensor_bytes(full)), "lora": (adapter_s, tensor_bytes(adapter_state(model)))}
    finally:
        engine.close()


def bench_vllm(
    peft_model: Any, tokenizer: Any, rank: int, reps: int, workdir: Path
) -> dict[str, tuple[float, int]]:
    model = peft_model.get_base_model()
    base = workdir / "base"
    model.config.save_pretrained(base)
    tokenizer.save_pretrained(base)
    save_state(base_state(model).items(), base)
    config = VLLMServerConfig(dtype="float32", max_model_len=1024, max_lora_rank=rank)
    servers = VLLMServers(base, "policy-base", config, workdir / "servers").start()
    try:
        servers.swap_adapter("policy", save_adapter(peft_model, workdir / "adapter-first"), replace=False)

        def full(i: int) -> None:
            folder = workdir / f"full-{i}"
            save_state(base_state(model).items(), folder)
            servers.reload(folder)

        def lora(i: int) -> None:
            nudge(model, i)
            servers.swap_adapter("policy", save_adapter(peft_model, workdir / f"adapter-{i}"))

        full_s = median_seconds(full, reps)
        lora_s = median_seconds(lora, reps)
        return {
            "full": (full_s, folder_bytes(workdir / "full-0")),
            "lora": (lora_s, folder_bytes(workdir / "adapter-0")),
        }
    finally:
        servers.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="demo,120m", help=f"comma-separated: {', '.join(SIZES)}")
    parser.add_argument("--engines", default="torch", help="comma-separated: torch, vllm")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument(
        "--smoke", action="store_true", help="the demo's model on the torch engine, one publish each way"
    )
    args = parser.parse_args()
    if args.smoke:
        args.models, args.engines, args.reps = "demo", "torch", 1
    configure_logging("warning")
    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    rows: list[tuple[str, str, str, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="agl-lora-bench-") as tmp:
        for name in args.models.split(","):
            model = build_model(model_size(name), seed=0, tokenizer=tokenizer)
            n_params = sum(p.numel() for p in model.parameters())
            peft_model = apply_lora(model, lora_settings(args.rank, 2 * args.rank, "all-linear"))
            n_adapter = sum(t.numel() for t in adapter_state(model).values())
            print(
                f"{name}: {n_params / 1e6:.1f}M parameters, adapter rank {args.rank}: {n_adapter / 1e6:.3f}M",
                flush=True,
            )
            for engine in args.engines.split(","):
                if engine == "torch":
                    results = bench_torch(model, tokenizer, args.reps)
                elif engine == "vllm":
                    results = bench_vllm(peft_model, tokenizer, args.rank, args.reps, Path(tmp) / name)
                else:
                    sys.exit(f"unknown engine {engine!r}: torch or vllm")
                for way in ("full", "lora"):
                    seconds, size = results[way]
                    rows.append((name, engine, way, seconds, size))
                    print(
                        f"  {engine:5} {way:4}: {seconds * 1000:9.2f} ms  {size / 1e6:10.3f} MB", flush=True
                    )
                (fs, fb), (ls, lb) = results["full"], results["lora"]
                print(f"  {engine:5} full/LoRA: time {fs / ls:6.1f}x, bytes {fb / lb:7.1f}x", flush=True)
    print("\nmodel  engine  full ms  LoRA ms  time ratio  full MB  LoRA MB  bytes ratio")
    for i in range(0, len(rows), 2):
        (m, e, _, fs, fb), (_, _, _, ls, lb) = rows[i], rows[i + 1]
        print(
            f"{m:6} {e:6} {fs * 1e3:8.2f} {ls * 1e3:8.2f} {fs / ls:10.1f}x {fb / 1e6:8.2f} {lb / 1e6:8.3f} {fb / lb:10.1f}x"
        )


if __name__ == "__main__":
    main()
