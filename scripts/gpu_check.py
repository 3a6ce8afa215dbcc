#!/usr/bin/env python3
"""The torch backend on one GPU, checked in one short run; the last line of output is a JSON summary.

Made for a machine that has CUDA torch and transformers but not this project nor its light
dependencies, and no network (docs/torch_backend.md § "GPU check"):

    # here, with network: a folder with the project's wheel and what it needs beyond the GPU image
    python3 scripts/gpu_check.py --build-wheels .gpu-wheels
    # on the GPU machine, offline: install what is missing from that folder, then check
    python3 scripts/gpu_check.py --wheels .gpu-wheels [--json-out FILE]
    # anywhere, tiny sizes on the CPU (the suite runs this: tests/torch_backend/test_gpu_check.py)
    python3 scripts/gpu_check.py --device cpu

Parts, each in its own process with its own time budget, all within `--budget` seconds (480): a
part that fails, crashes or runs out of time is reported in the summary and the others still run.

    install   (with --wheels) pip installs agentlightning[train] offline: only what is missing
    env       versions, the device, the imports the other parts need
    engine    TorchEngine tokens/s at 1, 8 and 64 concurrent requests, bf16: the demo's model and
              a random model shaped like Qwen2.5-0.5B
    update    PolicyUpdater (GRPO step) tokens/s and peak memory on the 0.5B shape
    mismatch  log-probs the engine reports vs the policy's recomputation, fp32 and bf16
    demo      agl-demo (Gateway, Controller, trainer; torch engine + torch update on the device) for
              a few steps: validation reward before and after

Exit status 0 when every part passed, 1 otherwise; the summary says which failed and why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("engine", "update", "mismatch", "demo")  # in running order, after install and env
SUMMARY_VERSION = 1

# Qwen2.5-0.5B's shape (its config.json), randomly initialised: no weights are downloaded.
QWEN25_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# The same proportions (14 heads, 2 KV heads, tied head), small enough for a CPU test.
QWEN25_05B_TINY = {
    **QWEN25_05B,
    "vocab_size": 1024,
    "hidden_size": 112,
    "intermediate_size": 608,
    "num_hidden_layers": 2,
    "max_position_embeddings": 1024,
}


@dataclass(frozen=True)
class Sizes:
    big: dict[str, Any]  # the "0.5B" model's shape
    prompt_len: int  # engine and mismatch prompts (random token ids)
    gen_len: int  # engine: new tokens per request (ignore_eos)
    rounds: int  # engine: requests each concurrent client makes, one after the other
    update_rows: int
    update_prompt_len: int
    update_response_len: int
    micro_batch: int
    mismatch_prompts: int
    mismatch_tokens: int
    demo_args: tuple[str, ...]
    budgets: dict[str, float]  # seconds each part may run at most
    total_budget_s: float  # for everything, install included
    concurrency: tuple[int, ...] = (1, 8, 64)
    grace_s: dict[str, float] = field(default_factory=lambda: {"demo": 25.0})  # SIGTERM → SIGKILL


FULL = Sizes(
    big=QWEN25_05B,
    prompt_len=64,
    gen_len=128,
    rounds=2,
    update_rows=64,
    update_prompt_len=256,
    update_response_len=256,
    micro_batch=8,
    mismatch_prompts=16,
    mismatch_tokens=64,
    demo_args=(
        "torch_threads=4",
        "train.trainer.total_training_steps=5",
        "train.trainer.test_freq=5",
    ),
    budgets={"install": 90, "env": 45, "engine": 100, "update": 60, "mismatch": 60, "demo": 260},
    total_budget_s=480.0,  # the GPU machine's lease is minutes; the whole check must fit in 8
)
TINY = Sizes(
    big=QWEN25_05B_TINY,
    prompt_len=16,
    gen_len=8,
    rounds=1,
    update_rows=8,
    update_prompt_len=16,
    update_response_len=16,
    micro_batch=4,
    mismatch_prompts=4,
    mismatch_tokens=8,
    demo_args=(
        "torch_threads=1",
        "warmup.steps=30",
        "train_problems=4",
        "val_problems=4",
        "agents_at_once=8",
        "train.trainer.total_training_steps=1",
        "train.trainer.test_freq=1",
        "train.data.train_batch_size=2",
        "train.actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "train.actor_rollout_ref.rollout.n=2",
    ),
    # Generous: a tiny part takes seconds on a quiet 2-core machine, but minutes on a crowded one
    # (seen: importing torch took 60-100 s at a load of 30-70 on 2 cores); these only stop a hang.
    budgets={"install": 90, "env": 300, "engine": 300, "update": 300, "mismatch": 300, "demo": 400},
    total_budget_s=1500.0,
)


# --- the parts (each runs in its own process: `--part NAME`) -------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _IdsTokenizer:
    """What the engine needs of a tokenizer when nothing is decoded: pad and eos ids."""

    pad_token_id = 0
    eos_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def _qwen2(shape: dict[str, Any], device: Any, dtype: Any, seed: int = 0) -> Any:
    """A randomly initialised Qwen2ForCausalLM of `shape`, built directly on `device`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **shape, bos_token_id=None, eos_token_id=0, pad_token_id=0, attn_implementation="sdpa"
    )
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=dtype).eval()


def _models(sizes: Sizes, device: Any, dtype: Any) -> Any:
    """(name, model, tokenizer) for the demo's model and the 0.5B shape, one at a time."""
    from agentlightning.tiny_model import build_tiny

    model, tokenizer = build_tiny(seed=0)
    yield "demo", model.to(device=device, dtype=dtype).eval(), tokenizer
    del model
    _free(device)
    yield "qwen2.5-0.5b-shape", _qwen2(sizes.big, device, dtype), _IdsTokenizer()


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(n)]


def _params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _concurrent_tokens_per_s(engine: Any, prompts: list[list[int]], sizes: Sizes, clients: int) -> dict:
    """`clients` concurrent clients, each making `rounds` requests in turn: generated tokens per second."""
    import asyncio

    from agentlightning.torch_backend.engine import SamplingParams

    params = SamplingParams(max_tokens=sizes.gen_len, temperature=1.0, ignore_eos=True)

    async def client(i: int) -> int:
        tokens = 0
        for r in range(sizes.rounds):
            stream = engine.add_request([prompts[(i * sizes.rounds + r) % len(prompts)]], params)
            async for _, out in stream:
                if out.error is not None:
                    raise RuntimeError(f"engine error: {out.error}")
                tokens += out.token_id >= 0
        return tokens

    async def run() -> list[int]:
        return await asyncio.gather(*(client(i) for i in range(clients)))

    steps, generated = engine.stats.steps, engine.stats.generated_tokens
    _sync(engine.device)
    t0 = time.perf_counter()
    tokens = sum(asyncio.run(run()))
    _sync(engine.device)
    seconds = time.perf_counter() - t0
    steps = engine.stats.steps - steps
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "mean_batch": round((engine.stats.generated_tokens - generated) / max(steps, 1), 2),
    }


def part_engine(device: Any, sizes: Sizes) -> dict[str, Any]:
    import torch

    from agentlightning.torch_backend.engine import SamplingParams, TorchEngine

    out: dict[str, Any] = {
        "dtype": "bfloat16",
        "prompt_len": sizes.prompt_len,
        "gen_len": sizes.gen_len,
        "requests_per_client": sizes.rounds,
        "sampling": "temperature 1, log-probs, ignore_eos",
        "models": {},
    }
    for name, model, tokenizer in _models(sizes, device, torch.bfloat16):
        top = max(sizes.concurrency)
        engine = TorchEngine(
            model, tokenizer, max_num_seqs=top, max_model_len=sizes.prompt_len + sizes.gen_len
        )
        try:
            prompts = _prompts(top * sizes.rounds, sizes.prompt_len, model.config.vocab_size, seed=1)
            engine.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
            results = {str(c): _concurrent_tokens_per_s(engine, prompts, sizes, c) for c in sizes.concurrency}
        finally:
            engine.close()
        out["models"][name] = {"params": _params(model), "concurrency": results}
        del engine, model
        _free(device)
    return out


def _rows(prompts: list[list[int]], responses: list[list[int]], log_probs: list[list[float]] | None) -> list:
    from agentlightning.rows import TrainingRow
    from agentlightning.trainer.shaping import set_loss_weights

    rows = [
        TrainingRow(
            rollout_id=f"r{i}",
            group_id=f"g{i // 4}",
            prompt_ids=list(p),
            response_ids=list(r),
            response_mask=[1] * len(r),
            rollout_log_probs=None if log_probs is None else list(log_probs[i]),
            model_versions=[0] * len(r),
            reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    set_loss_weights(rows)
    return rows


def part_update(device: Any, sizes: Sizes) -> dict[str, Any]:
    import math
    import resource

    import torch

    from agentlightning.torch_backend.policy import ActorConfig, OptimConfig, PolicyUpdater

    model = _qwen2(sizes.big, device, torch.float32)
    updater = PolicyUpdater(
        model,
        ActorConfig(optim=OptimConfig(lr=1e-6), ppo_micro_batch_size_per_gpu=sizes.micro_batch),
        device=device,
    )
    vocab = sizes.big["vocab_size"]
    n, plen, rlen = sizes.update_rows, sizes.update_prompt_len, sizes.update_response_len
    prompts = _prompts(n, plen, vocab, seed=2)
    responses = _prompts(n, rlen, vocab, seed=3)
    # A random model's log-probs are close to uniform: near ratio 1, as on fresh rollouts.
    rows = _rows(prompts, responses, [[-math.log(vocab)] * rlen for _ in range(n)])
    updater.update([rows[: sizes.micro_batch]])  # warm-up: kernels, allocator, AdamW state
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, grad_norms = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        metrics = updater.update([rows])
        _sync(device)
        times.append(time.perf_counter() - t0)
        grad_norms.append(metrics["actor/grad_norm"])
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"
    tokens = n * (plen + rlen)
    return {
        "model": "qwen2.5-0.5b-shape",
        "params": _params(model),
        "rows": n,
        "row_tokens": plen + rlen,
        "micro_batch": sizes.micro_batch,
        "optimizer_steps_per_update": 1,
        "autocast": str(updater.autocast_dtype).removeprefix("torch.") if updater.autocast_dtype else None,
        "tokens_per_update": tokens,
        "update_seconds": [round(t, 3) for t in times],
        "tokens_per_s": round(tokens / min(times), 1),
        "grad_norm": grad_norms[-1],
        "grad_norm_finite": all(math.isfinite(g) for g in grad_norms),
        "peak_memory_bytes": int(peak),
        "peak_memory_gib": round(peak / 2**30, 3),
        "peak_memory_kind": kind,
    }


# (label, engine weights, policy's actor.dtype): "bf16" is what a GPU run uses by default
# (rollout.dtype auto → bf16 weights; actor.dtype auto → fp32 weights under bf16 autocast).
MISMATCH_PAIRS = (
    ("fp32", "float32", "float32"),
    ("bf16", "bfloat16", "bfloat16"),
    ("bf16_engine_fp32_policy", "bfloat16", "float32"),
)


def part_mismatch(device: Any, sizes: Sizes) -> dict[str, Any]:
    import copy

    import torch

    from agentlightning.torch_backend.engine import SamplingParams, TorchEngine
    from agentlightning.torch_backend.mismatch import mismatch
    from agentlightning.torch_backend.policy import ActorConfig, PolicyUpdater

    out: dict[str, Any] = {
        "sampling": "temperature 1",
        "prompts": sizes.mismatch_prompts,
        "tokens_per_prompt": sizes.mismatch_tokens,
        "models": {},
    }
    params = SamplingParams(max_tokens=sizes.mismatch_tokens, temperature=1.0, seed=7, ignore_eos=True)
    for name, model, tokenizer in _models(sizes, device, torch.float32):
        prompts = _prompts(sizes.mismatch_prompts, sizes.prompt_len, model.config.vocab_size, seed=4)
        figures: dict[str, Any] = {}
        for label, engine_dtype, actor_dtype in MISMATCH_PAIRS:
            serving = copy.deepcopy(model).to(dtype=getattr(torch, engine_dtype))
            engine = TorchEngine(serving, tokenizer, max_num_seqs=len(prompts), seed=0)
            try:
                results = engine.generate(prompts, params)
            finally:
                engine.close()
            del engine, serving
            rows = _rows(prompts, [r.token_ids for r in results], None)
            updater = PolicyUpdater(model, ActorConfig(dtype=actor_dtype), device=device)
            policy = updater.compute_log_probs(rows)
            del updater
            figures[label] = {
                "engine_dtype": engine_dtype,
                "policy_dtype": actor_dtype,
                **{
                    k: (int(v) if k == "tokens" else v)
                    for k, v in mismatch([r.logprobs for r in results], policy).items()
                },
            }
            _free(device)
        out["models"][name] = figures
        del model
        _free(device)
    return out


DEMO_RESULT = re.compile(r"validation reward: (\d+\.\d+) -> (\d+\.\d+)")


def part_demo(device: Any, sizes: Sizes, work: Path) -> dict[str, Any]:
    from agentlightning.demo import cli
    from agentlightning.trainer.tracking import METRICS_FILE, read_metrics

    out_dir = work / "demo"
    argv = [
        f"output_dir={out_dir}",
        "seed=0",
        "engine=torch",
        "trainer_backend=torch",
        "train.trainer.logger=[console,jsonl]",
        f"train.actor_rollout_ref.rollout.device={device.type}",
        *sizes.demo_args,
    ]
    t0 = time.perf_counter()
    try:
        cli.main(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"agl-demo exited with {exc.code} (its output is in the log)") from None
    seconds = time.perf_counter() - t0
    run_dir = out_dir / "seed0"
    records = read_metrics(run_dir / METRICS_FILE)
    val = [[int(r["step"]), r["val/reward"]] for r in records if "val/reward" in r]
    train = [[int(r["step"]), r["training/reward"]] for r in records if "training/reward" in r]
    if len(val) < 2:
        raise RuntimeError(f"the demo recorded {len(val)} validation(s); see {run_dir}")
    gateway_log = (run_dir / "gateway.log").read_text(errors="replace")
    return {
        "argv": argv,
        "device": device.type,
        "seconds": round(seconds, 1),
        "steps": max((s for s, _ in train), default=0),
        "val_reward_before": val[0][1],
        "val_reward_after": val[-1][1],
        "val_reward": val,
        "train_reward": train,
        "gateway_log_tracebacks": gateway_log.count("Traceback (most recent call last)"),
        "run_dir": str(run_dir),
    }


def part_env(device: Any, sizes: Sizes) -> dict[str, Any]:
    import importlib
    import platform

    import torch
    import transformers

    import agentlightning

    imports = {}
    for module in (
        "fastapi",
        "uvicorn",
        "structlog",
        "omegaconf",
        "orjson",
        "aiohttp",
        "openai",
        "agentlightning.server.app",
        "agentlightning.controller.cli",
        "agentlightning.torch_backend.trainer",
        "agentlightning.demo.agent",
    ):
        try:
            importlib.import_module(module)
            imports[module] = "ok"
        except Exception as exc:  # reported, not raised: the summary says what is missing
            imports[module] = f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "agentlightning": str(Path(agentlightning.__file__).parent),
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "imports": imports,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(
            cuda=torch.version.cuda,
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_count=torch.cuda.device_count(),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    missing = [m for m, status in imports.items() if status != "ok"]
    if missing:
        raise RuntimeError(f"cannot import {', '.join(missing)}: {out}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda, but torch {torch.__version__} sees no CUDA device: {out}")
    return out


def run_part(name: str, device_name: str, size: str, work: Path, result: Path) -> None:
    """Child process: run one part, write its JSON to `result` (also on failure)."""
    t0 = time.perf_counter()
    try:
        import torch

        device = torch.device(device_name)
        sizes = TINY if size == "tiny" else FULL
        if name == "demo":
            data = part_demo(device, sizes, work)
        else:
            data = {"env": part_env, "engine": part_engine, "update": part_update, "mismatch": part_mismatch}[
                name
            ](device, sizes)
        data = {"ok": True, **data}
    except BaseException as exc:  # every failure becomes the part's report
        data = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc().splitlines()[-12:],
        }
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    result.write_text(json.dumps(data))


# --- the parent: install, then each part in its own process under a deadline ---------------------


def _log_tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the part's process group, SIGKILL it after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the leader is gone; nothing it started in its group may outlive it
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _demo_pids(log: Path) -> list[int]:
    """The Gateway, Controller and trainer pids agl-demo printed (each in its own session)."""
    return [int(p) for line in _log_tail(log, 10_000) for p in re.findall(r"\bpid (\d+)", line)]


def run_child(name: str, argv: list[str], timeout: float, grace: float, work: Path, env: dict) -> dict:
    log, result = work / f"{name}.log", work / f"{name}.json"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--result", str(result)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=work,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc, grace)
            for pid in _demo_pids(log) if name == "demo" else []:
                try:  # agl-demo stops these itself on SIGTERM; this is for when it could not
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return {
                "ok": False,
                "timed_out": True,
                "error": f"ran past its budget of {timeout:.0f} s and was stopped",
                "wall_s": round(time.monotonic() - t0, 1),
                "log": str(log),
                "log_tail": _log_tail(log),
            }
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        data = {"ok": False, "error": f"the part's process exited with {code} and left no result"}
    if not data.get("ok"):
        data.update(log=str(log), log_tail=_log_tail(log))
    return data


def requirements(project_wheel: Path, extras: tuple[str, ...] = ("train",)) -> list[str]:
    """The project's requirements (core and `extras`) from its wheel's METADATA, as pip strings."""
    with zipfile.ZipFile(project_wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    reqs = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.removeprefix("Requires-Dist:").strip().partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra is None:
            reqs.append(line.removeprefix("Requires-Dist:").strip())
        elif extra.group(1) in extras:
            reqs.append(req.strip())
    return reqs


def _project_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("agentlightning-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(
            f"{folder} holds {len(wheels)} agentlightning-*.whl (one is needed): build it with --build-wheels"
        )
    return wheels[0]


def _installed_satisfies(req: str) -> bool:
    """Whether this environment already has a distribution that satisfies `req` (or it is not
    for this Python): pip is then not asked about it, nor about what that distribution needs."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement

    parsed = Requirement(req)
    if parsed.marker is not None and not parsed.marker.evaluate({"extra": ""}):
        return True
    try:
        return parsed.specifier.contains(version(parsed.name), prereleases=True)
    except PackageNotFoundError:
        return False


def install(folder: Path, timeout: float) -> dict[str, Any]:
    """Offline: the project's requirements that this environment lacks (pip resolves their own
    needs against what is installed and the folder), then the project without dependencies."""
    t0 = time.monotonic()
    wheel = _project_wheel(folder)
    wanted = requirements(wheel)
    missing = [r for r in wanted if not _installed_satisfies(r)]
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder)]
    pip += "--disable-pip-version-check --no-cache-dir --no-compile --root-user-action=ignore".split()
    installed: list[str] = []
    for args in (missing, ["--no-deps", "--force-reinstall", str(wheel)]):
        if not args:  # nothing missing
            continue
        left = timeout - (time.monotonic() - t0)
        proc = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=max(left, 1.0))
        if proc.returncode != 0:
            return {
                "ok": False,
                "error": f"pip install {' '.join(args[:3])}… exited with {proc.returncode}",
                "log_tail": (proc.stdout + proc.stderr).splitlines()[-15:],
                "wall_s": round(time.monotonic() - t0, 1),
            }
        for line in proc.stdout.splitlines():
            if line.startswith("Successfully installed "):
                installed += line.removeprefix("Successfully installed ").split()
    return {
        "ok": True,
        "wheel": wheel.name,
        "already_there": [r for r in wanted if r not in missing],
        "installed": installed,
        "wall_s": round(time.monotonic() - t0, 1),
    }


# Already on the GPU image this is made for (docs/torch_backend.md); large, so not carried.
ON_THE_GPU_IMAGE = ("torch", "transformers", "numpy", "tensorboard", "matplotlib")
# Only an sdist on PyPI (hydra-core and omegaconf pin it): built into a wheel here.
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)
WHEELS_LIMIT_BYTES = 48 * 2**20  # the GPU machine takes 64 MiB of files per call, the repo included


def build_wheels(folder: Path, python_version: str) -> int:
    """Here, with network: the project's wheel and its dependencies minus ON_THE_GPU_IMAGE, for
    CPython `python_version` on manylinux x86-64 (what `--wheels` installs from)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("agentlightning-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    leftovers = [p for p in (ROOT / "build", ROOT / "agentlightning.egg-info") if not p.exists()]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(folder), str(ROOT)], check=True)
    for path in leftovers:  # setuptools builds in the checkout: remove what it left there
        shutil.rmtree(path, ignore_errors=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(folder), *SDIST_ONLY], check=True)
    wanted = [r for r in requirements(_project_wheel(folder)) if _dist_name(r) not in ON_THE_GPU_IMAGE]
    abi = "cp" + python_version.replace(".", "")
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64"]
    download = f"download -q --only-binary=:all: --implementation cp --python-version {python_version}"
    download += f" --abi {abi} --abi abi3 --abi none"
    download += "".join(f" --platform {p}" for p in platforms)
    subprocess.run(
        [*pip, *download.split(), "--find-links", str(folder), "-d", str(folder), *wanted], check=True
    )
    files = sorted(folder.glob("*.whl"))
    total = sum(f.stat().st_size for f in files)
    print(f"gpu_check: {len(files)} wheels, {total / 2**20:.1f} MiB in {folder}")
    if total > WHEELS_LIMIT_BYTES:
        print(
            f"gpu_check: more than {WHEELS_LIMIT_BYTES / 2**20:.0f} MiB: too large to carry", file=sys.stderr
        )
        return 1
    return 0


def _dist_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0].lower().replace("_", "-")


def check(args: argparse.Namespace) -> dict[str, Any]:
    """Install (with --wheels), then env and the parts, each under its own budget and the total."""
    started = time.monotonic()
    sizes = TINY if (args.size == "tiny" or (args.size == "auto" and args.device == "cpu")) else FULL
    total = args.budget or sizes.total_budget_s
    deadline = started + total
    budgets = {**sizes.budgets, **args.part_budget}
    work = Path(args.work or tempfile.mkdtemp(prefix="agl-gpu-check-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "check": "agentlightning torch backend on one device",
        "summary_version": SUMMARY_VERSION,
        "device": args.device,
        "size": "tiny" if sizes is TINY else "full",
        "budget_s": total,
        "work_dir": str(work),
        "parts": {},
    }
    parts: dict[str, Any] = summary["parts"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if args.wheels:
        say("install: from " + args.wheels)
        try:
            parts["install"] = install(
                Path(args.wheels), min(budgets["install"], deadline - time.monotonic())
            )
        except Exception as exc:  # reported in the summary
            parts["install"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    else:  # the checkout itself, for the parts' processes (they run in the work folder)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    child = [sys.executable, str(Path(__file__).resolve()), "--work", str(work)]
    child += ["--device", args.device, "--size", summary["size"]]
    for name in ("env", *[p for p in PARTS if p in args.parts]):
        if name != "env" and not parts["env"].get("ok"):
            parts[name] = {"ok": False, "skipped": "the env part failed"}
            continue
        grace = sizes.grace_s.get(name, 5.0)
        timeout = min(budgets[name], deadline - time.monotonic() - grace - 2.0)
        if timeout <= 0:
            parts[name] = {"ok": False, "skipped": "no time left in the total budget"}
            continue
        say(f"{name}: up to {timeout:.0f} s")
        parts[name] = run_child(name, [*child, "--part", name], timeout, grace, work, env)
        parts[name]["budget_s"] = round(timeout, 1)
        say(f"{name}: {'ok' if parts[name].get('ok') else 'FAILED'} in {parts[name].get('wall_s', '?')} s")
    summary["ok"] = all(p.get("ok") for p in parts.values())
    summary["failed"] = [n for n, p in parts.items() if not p.get("ok")]
    summary["wall_s"] = round(time.monotonic() - started, 1)
    return summary


def say(line: str) -> None:
    print(f"gpu_check: {line}", flush=True)


def _budget(text: str) -> tuple[str, float]:
    name, _, seconds = text.partition("=")
    if name not in ("install", "env", *PARTS) or not seconds:
        raise argparse.ArgumentTypeError(
            f"expected PART=SECONDS with PART one of install, env, {', '.join(PARTS)}"
        )
    return name, float(seconds)


def _parts(text: str) -> list[str]:
    names = [p for p in text.split(",") if p]
    bad = [p for p in names if p not in PARTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument(
        "--size", choices=("auto", "tiny", "full"), default="auto", help="auto: tiny on cpu, full on cuda"
    )
    ap.add_argument(
        "--wheels", metavar="DIR", help="install what is missing from this folder first (offline)"
    )
    ap.add_argument("--build-wheels", metavar="DIR", help="build that folder here (needs network) and exit")
    ap.add_argument("--python-version", default="3.12", help="--build-wheels: the GPU machine's Python")
    ap.add_argument(
        "--parts", type=_parts, default=list(PARTS), help=f"comma-separated, of {','.join(PARTS)}"
    )
    ap.add_argument("--budget", type=float, help="seconds for everything (480 full, 1500 tiny)")
    ap.add_argument(
        "--part-budget",
        type=_budget,
        action="append",
        default=[],
        metavar="PART=SECONDS",
        help="override one part's budget (repeatable)",
    )
    ap.add_argument("--work", help="folder for logs and the demo's run (default: a new temporary one)")
    ap.add_argument("--json-out", help="also write the summary to this file")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.part_budget = dict(args.part_budget)
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        ap.error(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    if args.build_wheels:
        return build_wheels(Path(args.build_wheels), args.python_version)
    if args.part:
        run_part(args.part, args.device, args.size, Path(args.work), Path(args.result))
        # The result is written: skip the interpreter's teardown (engine threads, CUDA, torch's
        # pools), which can take long enough on a busy machine to count against the budget.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    summary = check(args)
    line = json.dumps(summary)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(line, flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
