"""Learning on the demo task: each algorithm, LoRA and the two-role demo, over several seeds.

    PYTHONPATH=$PWD .venv/bin/python bench/learning.py [--configs grpo,rloo] [--seeds 0,1,2]
        [--steps 10] [--out DIR] [--report-only] [--smoke]

Each (config, seed) is one `agl-demo` run — Gateway, Controller and trainer as processes, the
torch engine — on the seed's warm model (built once per seed, then `warmup.reuse`), validated
greedily every `--test-freq` steps on `--val-problems` problems. The table gives, per config, the
mean ± sd over the seeds of the validation before training, the final and the best validation,
and the step the best was first reached. Minutes per run on a laptop CPU: the whole grid is run
by hand (docs/training.md § Measured: learning over seeds prints its table); `--smoke` runs one
tiny run so the suite knows the script works. `--report-only` prints the table of an `--out`
folder again (runs already there are never redone: a stopped bench goes on where it stopped).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

A = "train.actor_rollout_ref.actor"
CONFIGS: dict[str, list[str]] = {
    "grpo": [],  # the demo's defaults (clip_ratio_high=0.28)
    "drgrpo": [
        "train.algorithm.norm_adv_by_std_in_grpo=false",
        f"{A}.loss_agg_mode=seq-mean-token-sum-norm",
        f"{A}.loss_scale_factor=32",
    ],
    "dapo": [
        f"{A}.loss_agg_mode=token-mean",
        "train.algorithm.filter_groups.enable=true",
        "train.algorithm.filter_groups.max_num_gen_batches=3",
    ],
    "gspo": [f"{A}.policy_loss.loss_mode=gspo", f"{A}.clip_ratio_low=0.0003", f"{A}.clip_ratio_high=0.0004"],
    "rloo": ["train.algorithm.adv_estimator=rloo"],
    "reinforce_pp": ["train.algorithm.adv_estimator=reinforce_plus_plus"],
    "cispo": [f"{A}.policy_loss.loss_mode=cispo"],
    # LoRA at the demo's lora_lr (5e-3), and at the full fine-tuning lr it once used (5e-4)
    "lora": ["train.actor_rollout_ref.model.lora_rank=8", "train.actor_rollout_ref.model.lora_alpha=16"],
    "lora_lr5e-4": [
        "train.actor_rollout_ref.model.lora_rank=8",
        "train.actor_rollout_ref.model.lora_alpha=16",
        f"{A}.optim.lr=5e-4",
    ],
    "roles": ["roles=true"],  # two policies, a planner and a writer (docs/policies.md)
}
ALGORITHMS = ["grpo", "drgrpo", "dapo", "gspo", "rloo", "reinforce_pp", "cispo"]
SMOKE = [
    "warmup.steps=30",
    "train_problems=4",
    "val_problems=4",
    "agents_at_once=8",
    "train.data.train_batch_size=2",
    f"{A}.ppo_mini_batch_size=2",
    "train.actor_rollout_ref.rollout.n=2",
]


def run_demo(
    out: Path,
    name: str,
    seed: int,
    args: argparse.Namespace,
    overrides: Sequence[str] | None = None,
    launcher: Sequence[str] = ("-m", "agentlightning.demo.cli"),
    env: Mapping[str, str] | None = None,
) -> Path:
    """One agl-demo run (skipped when a finished one is there) with `overrides` (default: the
    config `name`'s), started by `python *launcher` (another script may run the demo with a
    subclass of its `Demo`); its run folder."""
    folder = out / name
    run_dir = folder / f"seed{seed}"
    done = run_dir / "bench_done.json"
    if done.is_file():
        return run_dir
    warm = out / "warm" / f"seed{seed}" / "warm_model"
    size = SMOKE if args.smoke else [f"val_problems={args.val_problems}"]
    argv = [
        sys.executable,
        *launcher,
        f"output_dir={folder}",
        f"seed={seed}",
        *size,
        f"train.trainer.total_training_steps={args.steps}",
        f"train.trainer.test_freq={args.test_freq}",
        *(CONFIGS[name] if overrides is None else overrides),
    ]
    if (warm / "config.json").is_file():
        argv.append(f"warmup.reuse={warm}")
    started = time.monotonic()
    print(f"run {name} seed {seed}: {' '.join(argv[1 + len(launcher) :])}", flush=True)
    demo = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        output, _ = demo.communicate()
    except KeyboardInterrupt:  # the demo got the same Ctrl-C: let it stop what it started
        demo.wait()  # (subprocess.run would SIGKILL it and leave its Gateway and Controller behind)
        raise
    if demo.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed ({demo.returncode}):\n{output[-3000:]}")
    if not (warm / "config.json").is_file():  # the seed's first run: keep its warm model for the others
        warm.parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "warm_model").rename(warm)
    done.write_text(json.dumps({"wall_s": round(time.monotonic() - started, 1)}))
    return run_dir


def summary(run_dir: Path) -> dict[str, float]:
    """Validation before, at the first validation after training began, final, best, and the
    step the best was first reached."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(int(r["step"]), float(r["val/reward"])) for r in records if "val/reward" in r]
    best = max(value for _, value in curve)
    return {
        "before": curve[0][1],
        "first": curve[1][1] if len(curve) > 1 else curve[0][1],
        "final": curve[-1][1],
        "best": best,
        "best_step": float(next(step for step, value in curve if value == best)),
        "wall_s": float(json.loads((run_dir / "bench_done.json").read_text())["wall_s"]),
    }


def mean_sd(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def report(out: Path, configs: list[str], seeds: list[int], test_freq: int) -> None:
    print(
        f"| config | seeds | before | step {test_freq} | final | best | step of best | wall s / run |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for name in configs:
        runs = [out / name / f"seed{seed}" for seed in seeds]
        rows = [summary(r) for r in runs if (r / "bench_done.json").is_file()]
        if not rows:
            continue
        cells = [mean_sd([row[key] for row in rows]) for key in ("before", "first", "final", "best")]
        step = mean_sd([row["best_step"] for row in rows], 1)
        wall = mean_sd([row["wall_s"] for row in rows], 0)
        print(f"| {name} | {len(rows)} | {' | '.join(cells)} | {step} | {wall} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default=",".join([*ALGORITHMS, "lora", "lora_lr5e-4", "roles"]))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--test-freq", type=int, default=5)
    parser.add_argument("--val-problems", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(".agl/bench/learning"))
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one tiny run: grpo, one seed, two steps")
    args = parser.parse_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown config(s) {unknown}: choose from {sorted(CONFIGS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.smoke:  # a fresh folder: a smoke run that found an earlier one would show nothing
        configs, seeds, args.steps, args.test_freq = ["grpo"], [0], 2, 1
        args.out = Path(tempfile.mkdtemp(prefix="agl-bench-learning-"))
    try:
        if not args.report_only:
            for seed in seeds:
                for name in configs:
                    run_demo(args.out, name, seed, args)
        report(args.out, configs, seeds, args.test_freq)
    finally:
        if args.smoke:
            shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
