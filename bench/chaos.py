"""Chaos A/B on the demo: the same seed trained while model calls fail, three ways.

    PYTHONPATH=$PWD .venv/bin/python bench/chaos.py [--seeds 0] [--steps 15] [--fault-rate 0.2]
        [--out DIR] [--plot PNG] [--report-only] [--smoke]

Every run is `agl-demo` (Gateway, Controller and trainer as processes, the torch engine) on the
seed's warm model with the naive agent of bench/chaos_agent.py: a model call that still fails
after its tries ends the episode with reward 0, as most agents handle errors.

* `clean`: no faults;
* `hidden`: `--fault-rate` of the training calls fail inside the agent, before the Gateway: the
  Gateway has no evidence, the trainer takes the agent's 0 as the policy's failure — what every
  failure was before typed outcomes, and what any failure the system cannot see still is;
* `typed`: the same share of training calls fail at the Gateway (`proxy.fault_rate`, as a model
  server that is down for that call): the attempt's outcome is `model_unavailable`, and the
  trainer drops the rollout (docs/reliability.md).

Validation (greedy, every `--test-freq` steps) is never struck, so the curves measure the policy.
The table gives, per way, the mean ± sd over the seeds of the validation before, at each
validation and at its best, of the training reward (what the steps trained on, averaged over
them), and what the training steps saw (rollouts struck and dropped); with
`--plot` the curves are drawn. `--smoke` runs the three ways tiny (one seed, two steps) so the
suite knows the script works. Runs already in `--out` are not redone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from bench.learning import mean_sd, run_demo

WAYS = ("clean", "hidden", "typed")
NAIVE_AGENT = "train.agentlightning.local.agent_class=bench.chaos_agent:NaiveCalcAgent"


def _demo_main(argv: list[str], fault_rate: float, fault_seed: int) -> None:
    """Run agl-demo with the Gateway striking `fault_rate` of the training calls."""
    from agentlightning.demo import cli

    class ChaosDemo(cli.Demo):
        def gateway_overrides(self, train_cfg: DictConfig) -> list[str]:
            return [
                *super().gateway_overrides(train_cfg),
                f"proxy.fault_rate={fault_rate}",
                f"proxy.fault_seed={fault_seed}",
                "proxy.fault_modes=[train]",
            ]

    cli.main(argv, demo_class=ChaosDemo)


def run_way(out: Path, way: str, seed: int, args: argparse.Namespace) -> Path:
    env = {**os.environ, "CHAOS_FAULT_SEED": str(seed)}
    launcher: tuple[str, ...] = ("-m", "agentlightning.demo.cli")
    if way == "hidden":
        env["CHAOS_AGENT_FAULT_RATE"] = str(args.fault_rate)
    elif way == "typed":
        launcher = (__file__, "--demo", str(args.fault_rate), str(seed))
    return run_demo(out, way, seed, args, [NAIVE_AGENT, *args.train], launcher, env)


@dataclass
class Run:
    curve: dict[int, float]  # step -> validation reward
    train_curve: dict[int, float]  # step -> the reward that step trained on
    unavailable: float  # share of the training rollouts whose outcome was model_unavailable
    dropped: float  # share left out by the outcome rules
    updates: int  # steps whose update changed the weights
    steps: int


def read_run(run_dir: Path) -> Run:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "training/reward" in r]
    rollouts = max(sum(r.get("training/n_rollouts", 0) for r in trained), 1)
    return Run(
        curve={int(r["step"]): float(r["val/reward"]) for r in records if "val/reward" in r},
        train_curve={int(r["step"]): float(r["training/reward"]) for r in trained},
        unavailable=sum(r.get("rollout/outcome/model_unavailable", 0) for r in trained) / rollouts,
        dropped=sum(r.get("training/n_rollouts_dropped_outcome", 0) for r in trained) / rollouts,
        updates=sum(1 for r in trained if r.get("actor/param_norm_change", 0) > 0),
        steps=len(trained),
    )


def mean_curve(curves: list[dict[int, float]]) -> dict[int, list[float]]:
    """step -> the seeds' values there."""
    steps = sorted({step for curve in curves for step in curve})
    return {step: [curve[step] for curve in curves if step in curve] for step in steps}


def report(out: Path, seeds: list[int], fault_rate: float) -> dict[str, list[Run]]:
    runs = {
        way: [
            read_run(out / way / f"seed{s}")
            for s in seeds
            if (out / way / f"seed{s}" / "bench_done.json").is_file()
        ]
        for way in WAYS
    }
    steps = sorted({step for rows in runs.values() for run in rows for step in run.curve})
    print(
        f"\nvalidation reward (greedy), mean ± sd over seeds {seeds}; "
        f"{fault_rate:.0%} of the training calls struck in `hidden` and `typed`\n"
    )
    print(
        "| way | "
        + " | ".join(f"step {s}" for s in steps)
        + " | best | training reward | steps that updated | model_unavailable | dropped by outcome |"
    )
    print("|---|" + "---|" * (len(steps) + 5))
    for way, rows in runs.items():
        if not rows:
            continue
        curve = mean_curve([run.curve for run in rows])
        cells = [mean_sd(curve[s]) if curve.get(s) else "" for s in steps]
        best = mean_sd([max(run.curve.values()) for run in rows])
        train = mean_sd([statistics.mean(run.train_curve.values()) for run in rows if run.train_curve])
        updates = (
            f"{statistics.mean(r.updates for r in rows):.1f} of {statistics.mean(r.steps for r in rows):.0f}"
        )
        unavailable = f"{statistics.mean(r.unavailable for r in rows):.1%}"
        dropped = f"{statistics.mean(r.dropped for r in rows):.1%}"
        print(f"| {way} | {' | '.join(cells)} | {best} | {train} | {updates} | {unavailable} | {dropped} |")
    return runs


def plot(runs: dict[str, list[Run]], path: Path, fault_rate: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "clean": "no faults",
        "hidden": f"{fault_rate:.0%} of calls fail, unseen: the agent's 0 trained",
        "typed": f"{fault_rate:.0%} of calls fail at the Gateway: model_unavailable, dropped",
    }
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for way, rows in runs.items():
        if rows:
            val = mean_curve([run.curve for run in rows])
            (line,) = ax.plot(list(val), [statistics.mean(v) for v in val.values()], "o-", label=labels[way])
            train = mean_curve([run.train_curve for run in rows])
            ax.plot(
                list(train),
                [statistics.mean(v) for v in train.values()],
                "--",
                color=line.get_color(),
                alpha=0.6,
            )
    ax.set_xlabel("step")
    ax.set_ylabel("reward: validation (greedy, o-), trained on (--)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("The demo while model calls fail (bench/chaos.py)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"plot: {path}")


def main() -> None:
    if sys.argv[1:2] == ["--demo"]:  # one run of the typed way (this script run by run_way)
        _demo_main(sys.argv[4:], float(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--test-freq", type=int, default=5)
    parser.add_argument("--val-problems", type=int, default=64)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=Path(".agl/bench/chaos"))
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the three ways tiny: one seed, two steps")
    parser.add_argument("train", nargs="*", help="train.KEY=VALUE overrides for every run")
    args = parser.parse_args()
    if not 0 < args.fault_rate < 1:
        parser.error(f"--fault-rate is a share of calls in (0, 1), got {args.fault_rate}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.smoke:  # a fresh folder: a smoke run that found an earlier one would show nothing
        seeds, args.steps, args.test_freq = [0], 2, 1
        args.out = Path(tempfile.mkdtemp(prefix="agl-bench-chaos-"))
    try:
        if not args.report_only:
            for seed in seeds:
                for way in WAYS:
                    run_way(args.out, way, seed, args)
        runs = report(args.out, seeds, args.fault_rate)
        if args.plot is not None:
            plot(runs, args.plot, args.fault_rate)
    finally:
        if args.smoke:
            shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
