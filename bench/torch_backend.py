"""Throughput of the torch backend: generation (ours vs Hugging Face `generate`) and the update.

Builds a randomly initialised Qwen2 of the given size (no downloads), then in one run:

* generation: `--prompts` prompts of `--prompt-len` tokens, `--gen-len` new tokens each, sampled
  at temperature 1 — with Hugging Face's `model.generate` on one left-padded batch (baseline)
  and with our `TorchEngine` (continuous batching, log-probs, per-sequence parameters); prints
  tokens/s of both and the ratio;
* update: one GRPO step of `PolicyUpdater` on rows of the same shape; prints tokens/s.

    .venv/bin/python bench/torch_backend.py                         # CPU, tiny
    .venv/bin/python bench/torch_backend.py --device cuda --hidden 1024 --layers 16 --prompts 64
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings

import torch

from agentlightning.rows import TrainingRow
from agentlightning.torch_backend.engine import SamplingParams, TorchEngine
from agentlightning.torch_backend.policy import (
    ActorConfig,
    OptimConfig,
    PolicyUpdater,
)
from agentlightning.trainer.shaping import set_loss_weights

warnings.filterwarnings("ignore")


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = max(1, args.hidden // 64)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3) // 64 * 64 or args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        max_position_embeddings=args.prompt_len + args.gen_len + 16,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


class _Tok:
    """The engine only needs ids, pad and eos here (no text is decoded)."""

    pad_token_id = 0
    eos_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="auto: fp32 on CPU, bf16 on CUDA (generation)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="best of N, alternating baseline and ours")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = (
        (torch.bfloat16 if device.type == "cuda" else torch.float32)
        if args.dtype == "auto"
        else getattr(torch, args.dtype)
    )
    model = build(args, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    rng = random.Random(0)
    prompts = [[rng.randrange(1, args.vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    total = args.prompts * args.gen_len
    out: dict[str, object] = {**vars(args), "device": str(device), "dtype": str(dtype), "params": n_params}

    # Baseline: Hugging Face generate, one static batch; ours: the engine. Alternated, best of N.
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)

    def run_hf() -> float:
        with torch.inference_mode():
            sync(device)
            t0 = time.perf_counter()
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=args.gen_len,
                min_new_tokens=args.gen_len,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                pad_token_id=0,
            )
            sync(device)
            return time.perf_counter() - t0

    engine = TorchEngine(model, _Tok(), max_num_seqs=max(256, args.prompts))
    params = SamplingParams(max_tokens=args.gen_len, temperature=1.0, ignore_eos=True)

    def run_ours() -> float:
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        sync(device)
        return time.perf_counter() - t0

    with torch.inference_mode():
        model.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=True, min_new_tokens=4)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    hf_times, our_times = [], []
    for _ in range(args.repeats):
        hf_times.append(run_hf())
        our_times.append(run_ours())
    hf_s, ours_s = min(hf_times), min(our_times)
    results = engine.generate(prompts, params)
    engine.close()
    out["generate_hf_tokens_per_s"] = round(total / hf_s, 1)
    out["generate_ours_tokens_per_s"] = round(total / ours_s, 1)
    out["generate_ratio_ours_over_hf"] = round(hf_s / ours_s, 3)

    # Update: one GRPO step on rows of the same shape (fp32 weights, bf16 autocast on CUDA).
    train_model = build(args, device, torch.float32)
    updater = PolicyUpdater(
        train_model,
        ActorConfig(optim=OptimConfig(lr=1e-6), ppo_micro_batch_size_per_gpu=args.micro),
        device=device,
    )
    rows = [
        TrainingRow(
            rollout_id=f"r{i}",
            group_id=f"g{i // 4}",
            prompt_ids=r.prompt_ids,
            response_ids=r.token_ids,
            response_mask=[1] * len(r.token_ids),
            rollout_log_probs=r.logprobs,
            model_versions=[0] * len(r.token_ids),
            reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, r in enumerate(results)
    ]
    set_loss_weights(rows)
    updater.update([rows[: args.micro]])  # warm-up
    sync(device)
    t0 = time.perf_counter()
    metrics = updater.update([rows])
    sync(device)
    update_s = time.perf_counter() - t0
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    out["update_tokens_per_s"] = round(tokens / update_s, 1)
    out["update_s"] = round(update_s, 3)
    out["update_grad_norm"] = round(metrics["actor/grad_norm"], 4)
    if device.type == "cuda":
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
