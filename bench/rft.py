"""RFT on the demo task: sample n per prompt with the warm model, fine-tune on the reward-1 rollouts.

Rejection-sampling fine-tuning through the system as a user runs it, every step a command of ours:

1. the demo's warm model (`agl-demo`'s supervised warm-up of the tiny Qwen2, in this process);
2. collection: `agl-eval` runs the demo agent n times per training problem at temperature 1 —
   the Gateway (SQLite store), the Controller and the torch engine, the agent's own `openai`
   client — and the Gateway records every call token-exact; the store is kept;
3. a Gateway on that store, and `agl-sft` on it: the rollouts with reward >= `--min-reward`,
   their rows built by the RL path's aggregation, full fine-tuning of the warm model;
4. `agl-eval` on the validation problems, greedy: the warm model and the SFT checkpoint.

    .venv/bin/python bench/rft.py                 # 100 problems x 8 samples; prints before -> after
    .venv/bin/python bench/rft.py --smoke         # a short warm-up, 4 problems x 2: that it runs

Prints the validation reward before -> after and the CPU minutes of each stage (this process and
the processes it waited for: `getrusage`). Wall times include whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentlightning.launch import start_gateway

REPO = Path(__file__).resolve().parent.parent


def cpu_seconds() -> float:
    """CPU time of this process and of its children it waited for (user + system)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(args: list[str], env: dict[str, str]) -> None:
    """One of our commands as its own process (its output shown as it comes)."""
    print("$", " ".join(args[2:] if args[1] == "-m" else args), flush=True)
    subprocess.run([sys.executable, *args], cwd=REPO, env=env, check=True)


def warm_model(folder: Path, steps: int, seed: int) -> Path:
    """The demo's warm model (agl-demo's warm-up: demo.yaml's model and warm-up settings)."""
    import torch

    from agentlightning.demo.warmup import WarmupConfig, warmup
    from agentlightning.tiny_model import TinyModelConfig, build_tiny, save_tiny

    if (folder / "config.json").is_file():
        return folder
    torch.set_num_threads(1)
    model, tokenizer = build_tiny(
        TinyModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2), seed
    )
    warmup(
        model, tokenizer, WarmupConfig(steps=steps, batch_size=16, lr=0.01, seed=seed, correct_op_prob=0.35)
    )
    return save_tiny(folder, model, tokenizer)


def write_problems(folder: Path, n_train: int, n_val: int, seed: int) -> tuple[Path, Path]:
    """The demo's problems: training ones fixed by the seed, validation ones by 10000 + seed."""
    from agentlightning.demo.task import make_dataset

    out = []
    for name, samples in (
        ("train", make_dataset(n_train, seed=seed, prefix="t")),
        ("val", make_dataset(n_val, seed=10_000 + seed, prefix="v")),
    ):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(s) + "\n" for s in samples))
        out.append(path)
    return out[0], out[1]


def mean_rewards(report: Path) -> dict[str, float]:
    data: dict[str, Any] = json.loads(report.read_text())
    return {name: float(p["mean_reward"]["value"]) for name, p in data["policies"].items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that the path runs")
    parser.add_argument("--out", default=".agl/bench-rft", help="the run's folder (replaced)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", type=int, default=100, help="training problems to sample")
    parser.add_argument("--n", type=int, default=8, help="samples per problem")
    parser.add_argument("--val-problems", type=int, default=128)
    parser.add_argument("--warmup-steps", type=int, default=800, help="the demo's warm-up (demo.yaml)")
    parser.add_argument("--warm-model", help="a warm_model/ of an earlier run (same seed): skip the warm-up")
    parser.add_argument("--min-reward", type=float, default=1.0, help="keep rollouts with reward >= this")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    if args.smoke:
        args.problems, args.n, args.val_problems, args.warmup_steps = 4, 2, 4, 20
        args.min_reward, args.epochs = 0.0, 1  # a 20-step warm-up rarely solves one: train on any reward

    out = (REPO / args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cpu: dict[str, float] = {}
    wall = time.perf_counter()

    start = cpu_seconds()
    if args.warm_model:
        shutil.copytree(args.warm_model, out / "warm_model")
    warm = warm_model(out / "warm_model", args.warmup_steps, args.seed)
    train, val = write_problems(out, args.problems, args.val_problems, args.seed)
    cpu["warm-up"] = cpu_seconds() - start

    start = cpu_seconds()
    collect = out / "collect"
    common = ["plot=false", "agents_at_once=32", "torch_threads=1", f"seed={args.seed}", "log_level=warning"]
    run(
        ["-m", "agentlightning.evaluation", f"data={train}", f"policies=[warm={warm}]", f"n={args.n}",
         "temperature=1.0", f"output_dir={collect}", *common],
        env,
    )  # fmt: skip
    sampled = mean_rewards(collect / "report.json")["warm"]
    cpu["collect"] = cpu_seconds() - start

    start = cpu_seconds()
    key = secrets.token_urlsafe(16)
    gateway = start_gateway(
        key=key,
        store_url=f"sqlite:///{collect / 'gateway.db'}",
        log_level="warning",
        log_path=out / "sft-gateway.log",
        env=env,
        ready_timeout=180,
    )
    try:
        run(
            ["-m", "agentlightning.torch_backend.sft", f"model.path={warm}", f"data.gateway.url={gateway.url}",
             f"data.gateway.key={key}", f"data.select.min_reward={args.min_reward}", f"train.epochs={args.epochs}",
             f"train.lr={args.lr}", "train.batch_size=16", f"train.seed={args.seed}", f"output_dir={out / 'sft'}",
             "device=cpu", "torch_threads=1", "log_level=warning"],
            env,
        )  # fmt: skip
    finally:
        gateway.stop(timeout=20)
    cpu["sft"] = cpu_seconds() - start

    start = cpu_seconds()
    run(
        ["-m", "agentlightning.evaluation", f"data={val}", f"policies=[warm={warm},sft={out / 'sft'}]", "n=1",
         "temperature=0.0", f"output_dir={out / 'validation'}", *common],
        env,
    )  # fmt: skip
    cpu["validation"] = cpu_seconds() - start
    rewards = mean_rewards(out / "validation" / "report.json")

    before, after = rewards["warm"], rewards["sft"]
    print()
    print(
        f"RFT on the demo task (seed {args.seed}): {args.problems} problems x {args.n} samples at T=1 "
        f"(mean reward {sampled:.3f}), SFT on reward >= {args.min_reward:g}, {args.epochs} epochs, lr {args.lr:g}"
    )
    print(
        f"validation reward (greedy, {args.val_problems} problems): {before:.3f} -> {after:.3f} ({after - before:+.3f})"
    )
    print(
        "CPU minutes: "
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in cpu.items())
        + f", total {sum(cpu.values()) / 60:.1f}"
    )
    print(f"wall minutes: {(time.perf_counter() - wall) / 60:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
