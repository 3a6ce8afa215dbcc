"""On-policy distillation against GRPO on the demo task: steps and wall time to 0.9 validation.

Both runs are `agl-demo` (Gateway, Controller, trainer as processes; the torch backend) from the
same warm model, with the same seed and the same rollouts per step:

1. GRPO: the demo as shipped (`algorithm.adv_estimator=grpo`); its last checkpoint is the teacher;
2. the teacher served by `agl-torch-server` (the checkpoint written out as a model folder, as
   agl-eval does), and OPD: the demo with `algorithm.distill` pointing at it, `reward_coef=0`:
   the student learns from the teacher's per-token log-probs alone.

    .venv/bin/python bench/opd.py                 # the demo's sizes (25 steps of 8 x 8), validation every 2
    .venv/bin/python bench/opd.py --smoke         # a short warm-up, 2 tiny steps each: that it runs

Prints one table: per method the validation before and after, the first step (and the wall
minutes from the start of training) at which validation reached `--target`. Wall times include
whatever else runs on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def demo(out: Path, args: argparse.Namespace, env: dict[str, str], *extra: str) -> list[dict[str, Any]]:
    """One agl-demo run; its metrics records."""
    cmd = [
        sys.executable,
        "-m",
        "agentlightning.demo.cli",
        f"output_dir={out}",
        f"seed={args.seed}",
        *args.sizes,
        *extra,
    ]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    return read_records(out, args.seed)


def summary(records: list[dict[str, Any]], target: float) -> tuple[float, float, str, str]:
    val = [(int(r["step"]), float(r["val/reward"]), float(r["time"])) for r in records if "val/reward" in r]
    start = val[0][2]
    reached = next(((s, t) for s, v, t in val if v >= target), None)
    steps = str(reached[0]) if reached else f"not in {val[-1][0]}"
    minutes = f"{(reached[1] - start) / 60:.1f}" if reached else "-"
    return val[0][1], val[-1][1], steps, minutes


def read_records(out: Path, seed: int) -> list[dict[str, Any]]:
    lines = (out / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def plot(runs: dict[str, list[dict[str, Any]]], target: float, path: Path) -> None:
    """Validation reward per step of each run, and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, records in runs.items():
        val = [(int(r["step"]), float(r["val/reward"])) for r in records if "val/reward" in r]
        ax.plot(*zip(*val, strict=True), "o-", label=name, linewidth=2)
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation reward (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("demo task: on-policy distillation vs GRPO, same start")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(
    grpo: list[dict[str, Any]], opd: list[dict[str, Any]], args: argparse.Namespace, out: Path
) -> None:
    print()
    print(
        f"On-policy distillation vs GRPO, demo task, seed {args.seed}, same warm model and rollouts per step"
    )
    print(
        f"| method | validation before | validation after | first step at >= {args.target} | wall minutes to it |"
    )
    print("|---|---|---|---|---|")
    for name, records in (("grpo", grpo), ("opd (teacher: the GRPO run's checkpoint)", opd)):
        before, after, reached, minutes = summary(records, args.target)
        print(f"| {name} | {before:.3f} | {after:.3f} | {reached} | {minutes} |")
    plot({"GRPO": grpo, "OPD (teacher: the GRPO run)": opd}, args.target, out / "opd_vs_grpo.png")
    print(f"picture: {out / 'opd_vs_grpo.png'}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that the path runs")
    parser.add_argument("--out", default=".agl/bench-opd", help="the runs' folder (replaced)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument(
        "--warm-model", help="a warm_model/ of an earlier demo run (same seed): skip the warm-up"
    )
    parser.add_argument("--test-freq", type=int, default=2, help="validate every this many steps")
    parser.add_argument("--val-problems", type=int, default=64)
    parser.add_argument(
        "--report-only", action="store_true", help="the table and picture of an earlier --out"
    )
    args = parser.parse_args()
    if args.report_only:
        out = (REPO / args.out).resolve()
        report(read_records(out / "grpo", args.seed), read_records(out / "opd", args.seed), args, out)
        return 0
    args.sizes = [f"train.trainer.test_freq={args.test_freq}", f"val_problems={args.val_problems}"]
    if args.smoke:
        args.sizes += [
            "warmup.steps=20",
            "train_problems=4",
            "val_problems=4",
            "train.trainer.test_freq=1",
            "train.data.train_batch_size=2",
            "train.actor_rollout_ref.rollout.n=2",
            "train.actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "train.trainer.total_training_steps=2",
        ]
    if args.warm_model:
        args.sizes.append(f"warmup.reuse={args.warm_model}")
    out = (REPO / args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }

    checkpoints = out / "grpo-checkpoints"
    grpo = demo(
        out / "grpo",
        args,
        env,
        f"train.trainer.save_freq={2 if args.smoke else 25}",
        f"train.trainer.default_local_dir={checkpoints}",
    )
    run = out / "grpo" / f"seed{args.seed}"
    from agentlightning.evaluation.policies import export_checkpoint
    from agentlightning.launch import start_torch_server
    from agentlightning.trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(checkpoints)
    if latest is None:
        raise SystemExit(f"bench/opd.py: the GRPO run left no checkpoint under {checkpoints}")
    teacher_dir = export_checkpoint(str(latest), out / "teacher")
    warm = run / "warm_model"
    teacher = start_torch_server(
        str(teacher_dir),
        seed=args.seed,
        torch_threads=1,
        log_level="warning",
        log_path=out / "teacher.log",
        env=env,
    )
    try:
        opd = demo(
            out / "opd",
            args,
            env,
            f"warmup.reuse={warm}",
            "train.algorithm.distill.enable=true",
            f"train.algorithm.distill.teacher_url={teacher.url}",
            f"train.algorithm.distill.teacher_tokenizer={teacher_dir}",
            "train.algorithm.distill.reward_coef=0.0",
        )
    finally:
        teacher.stop(timeout=20)

    report(grpo, opd, args, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
