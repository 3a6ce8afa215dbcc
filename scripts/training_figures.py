"""Tables and figures of docs/training.md § Measured, from agl-demo runs (their metrics.jsonl).

    python scripts/training_figures.py RUNS_DIR

RUNS_DIR holds one `agl-demo output_dir=RUNS_DIR/NAME` run per name (seed 0) and `done*.txt`
files with a line `NAME rc=0 wall_s=S ...` per finished run. Prints the algorithm table, the
per-step tables of the staleness and step-reward runs, and writes docs/img/training_staleness.png
and docs/img/training_step_rewards.png when those runs exist.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ALGORITHMS = ["grpo", "drgrpo", "dapo", "gspo", "rloo", "reinforce_pp", "cispo"]
STALENESS = {
    "stale_none": "no correction",
    "stale_tis": "token TIS (C=2)",
    "stale_mis": "sequence MIS ([0.5, 2])",
}
STEP = {"step_rollout": "rollout advantages", "step_step": "step advantages"}
IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def records(run: Path) -> list[dict]:
    path = run / "seed0" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def walls(runs: Path) -> dict[str, int]:
    out = {}
    for done in sorted(runs.glob("done*.txt")):
        for line in done.read_text().splitlines():
            name, *fields = line.split()
            if "rc=0" in fields:
                wall = next(f for f in fields if f.startswith("wall_s="))
                out[name] = int(wall.removeprefix("wall_s="))
    return out


def summary(recs: list[dict]) -> tuple[list[tuple[int, float]], int | None, float]:
    val = [(int(r["step"]), float(r["val/reward"])) for r in recs if "val/reward" in r]
    first = val[0][1]
    reached = next((step for step, v in val if v >= first + 0.3), None)
    train_s = sum(float(r.get("timing/step_s", 0.0)) for r in recs)
    return val, reached, train_s


def table(runs: Path) -> None:
    wall = walls(runs)
    print(
        "| algorithm | validation reward (step: reward) | final | +0.3 at step | training s | whole run s |"
    )
    print("|---|---|---|---|---|---|")
    for name in ALGORITHMS + list(STALENESS) + list(STEP):
        recs = records(runs / name)
        if not recs or not any("val/reward" in r for r in recs):
            print(f"| {name} | not run | | | | |")
            continue
        val, reached, train_s = summary(recs)
        curve = ", ".join(f"{s}: {v:.3f}" for s, v in val)
        steps = max(int(r["step"]) for r in recs)
        final = f"{val[-1][1]:.3f}" if name in wall else f"unfinished (step {steps})"
        shown = reached if reached is not None else "—"
        print(f"| {name} | {curve} | {final} | {shown} | {train_s:.0f} | {wall.get(name, '—')} |")


PER_STEP = [
    ("training/reward", "reward", "{:.3f}"),
    ("val/reward", "val", "{:.3f}"),
    ("training/staleness/max", "staleness max", "{:.0f}"),
    ("training/staleness/mean", "mean", "{:.2f}"),
    ("actor/sampler_trainer_kl_k3", "KL k3", "{:.2e}"),
    ("actor/sampler_trainer_is_max", "IS max", "{:.2f}"),
    ("actor/rollout_is_clipped_frac", "TIS clipped", "{:.4f}"),
    ("actor/rollout_rs_masked_frac", "MIS masked", "{:.4f}"),
    ("actor/entropy", "entropy", "{:.4f}"),
]


def per_step(runs: Path, names: dict[str, str], columns: list[tuple[str, str, str]]) -> None:
    """One row per step and run: the runs of a comparison side by side."""
    for name, label in names.items():
        recs = records(runs / name)
        if not recs:
            continue
        shown = [c for c in columns if any(c[0] in r for r in recs)]
        print(f"\n{name} ({label})\n")
        print("| step | " + " | ".join(c[1] for c in shown) + " |")
        print("|---" * (len(shown) + 1) + "|")
        by_step: dict[int, dict] = {}
        for r in recs:
            by_step.setdefault(int(r["step"]), {}).update(r)
        for step, r in sorted(by_step.items()):
            cells = [fmt.format(r[key]) if key in r else "" for key, _, fmt in shown]
            print(f"| {step} | " + " | ".join(cells) + " |")


def side_by_side(runs: Path, names: dict[str, str], columns: list[tuple[str, str, str]]) -> None:
    """One row per step, each column's value for every run that exists, separated by " / "."""
    present = [n for n in names if records(runs / n)]
    if not present:
        return
    steps: dict[str, dict[int, dict]] = {}
    for name in present:
        for r in records(runs / name):
            steps.setdefault(name, {}).setdefault(int(r["step"]), {}).update(r)
    print("\nside by side: " + " / ".join(f"{n} ({names[n]})" for n in present) + "\n")
    print("| step | " + " | ".join(c[1] for c in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for step in sorted(set().union(*(steps[n] for n in present))):
        cells = []
        for key, _, fmt in columns:
            values = [steps[n].get(step, {}).get(key) for n in present]
            cells.append(" / ".join("–" if v is None else fmt.format(v) for v in values))
        print(f"| {step} | " + " | ".join(cells) + " |")


def plot(runs: Path, names: dict[str, str], metrics: list[tuple[str, str]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = {n: label for n, label in names.items() if records(runs / n)}
    if not present:
        return
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), dpi=110)
    for ax, (key, ylabel) in zip(axes, metrics, strict=True):
        for name, label in present.items():
            pts = [(int(r["step"]), float(r[key])) for r in records(runs / name) if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-" if key == "val/reward" else "-", label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    runs = Path(sys.argv[1])
    table(runs)
    per_step(runs, STALENESS, PER_STEP)
    side_by_side(runs, STALENESS, [c for c in PER_STEP if c[0] != "training/staleness/mean"])
    per_step(runs, STEP, [*PER_STEP[:2], PER_STEP[-1]])
    plot(
        runs,
        STALENESS,
        [
            ("val/reward", "validation reward"),
            ("training/reward", "training reward"),
            ("actor/sampler_trainer_kl_k3", "sampler–trainer KL (k3)"),
            ("training/staleness/max", "staleness max (versions)"),
        ],
        IMG / "training_staleness.png",
        "agl-demo, async (48 groups in flight, 64 agents), seed 0",
    )
    plot(
        runs,
        STEP,
        [("val/reward", "validation reward"), ("training/reward", "training reward (outcome)")],
        IMG / "training_step_rewards.png",
        "agl-demo step_reward=true (transition rows), seed 0",
    )


if __name__ == "__main__":
    main()
