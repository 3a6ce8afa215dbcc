"""From the rollouts' results to the report: per policy and per task, the paired comparisons, the
JSON file (written whole or not at all), the markdown table and the PNG."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentlightning.evaluation.metrics import (
    bootstrap_mean,
    flips,
    paired_difference,
    pass_at_k,
    wilson,
)
from agentlightning.evaluation.rollouts import RolloutResult

SOLVED = 0.5  # a task counts as solved (for the flips) when at least half its samples succeed


def summarize_policy(
    results: Sequence[RolloutResult],
    task_ids: Sequence[str],
    n: int,
    ks: Sequence[int],
    threshold: float,
    seed: int,
    bootstrap_samples: int,
) -> dict[str, Any]:
    """One policy's numbers: overall, with intervals, and per task."""
    by_task: list[list[RolloutResult]] = [[] for _ in task_ids]
    for r in results:
        by_task[r.task].append(r)
    if any(len(samples) != n for samples in by_task):
        raise ValueError("every task needs its n results")
    per_task: list[dict[str, Any]] = []
    for task_id, samples in zip(task_ids, by_task, strict=True):
        rewards = [r.reward for r in sorted(samples, key=lambda r: r.sample)]
        successes = sum(r >= threshold for r in rewards)
        per_task.append(
            {
                "task": task_id,
                "rewards": rewards,
                "mean_reward": sum(rewards) / n,
                "successes": successes,
                "pass_at_k": {str(k): pass_at_k(n, successes, k) for k in ks},
            }
        )
    total = len(results)
    successes = sum(t["successes"] for t in per_task)
    task_means = [t["mean_reward"] for t in per_task]
    pass_k: dict[str, dict[str, Any]] = {}
    for k in ks:
        values = [t["pass_at_k"][str(k)] for t in per_task]
        pass_k[str(k)] = {
            "value": sum(values) / len(values),
            "interval": bootstrap_mean(values, seed, bootstrap_samples).as_list(),
        }
    return {
        "rollouts": total,
        "mean_reward": {
            "value": sum(task_means) / len(task_means),
            "interval": bootstrap_mean(task_means, seed, bootstrap_samples).as_list(),
        },
        "success_rate": {"value": successes / total, "interval": wilson(successes, total).as_list()},
        "pass_at_k": pass_k,
        "failed_rollouts": sum(r.state != "succeeded" for r in results),
        "rollouts_without_reward": sum(not r.has_reward for r in results),
        "calls_per_rollout": sum(r.calls for r in results) / total,
        "prompt_tokens_per_rollout": sum(r.prompt_tokens for r in results) / total,
        "completion_tokens_per_rollout": sum(r.completion_tokens for r in results) / total,
        "tasks": per_task,
    }


def compare(
    baseline: str,
    candidate: str,
    summaries: dict[str, dict[str, Any]],
    ks: Sequence[int],
    seed: int,
    samples: int,
) -> dict[str, Any]:
    """`candidate - baseline` on the same tasks: mean reward and pass@k, paired bootstrap; flips."""
    a, b = summaries[baseline]["tasks"], summaries[candidate]["tasks"]
    out: dict[str, Any] = {"baseline": baseline, "candidate": candidate}
    d = paired_difference([t["mean_reward"] for t in a], [t["mean_reward"] for t in b], seed, samples)
    out["mean_reward"] = {"difference": d.mean, "interval": d.interval.as_list()}
    out["pass_at_k"] = {}
    for k in ks:
        key = str(k)
        d = paired_difference(
            [t["pass_at_k"][key] for t in a], [t["pass_at_k"][key] for t in b], seed, samples
        )
        out["pass_at_k"][key] = {"difference": d.mean, "interval": d.interval.as_list()}
    n = len(a[0]["rewards"])
    solved_a = [t["successes"] / n >= SOLVED for t in a]
    solved_b = [t["successes"] / n >= SOLVED for t in b]
    f = flips([t["task"] for t in a], solved_a, solved_b)
    out["flips"] = {"gained": f.gained, "lost": f.lost}
    return out


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Write `report` beside `path` and rename it into place: a reader sees all of it or nothing."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ci(entry: dict[str, Any]) -> str:
    low, high = entry["interval"]
    return f"{entry['value']:.3f} [{low:.3f}, {high:.3f}]"


def _diff(entry: dict[str, Any]) -> str:
    low, high = entry["interval"]
    return f"{entry['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def markdown(report: dict[str, Any]) -> str:
    """The policies' table, then the paired comparisons, as markdown."""
    ks = report["settings"]["k"]
    head = [
        "policy",
        "mean reward",
        "success rate",
        *(f"pass@{k}" for k in ks),
        "calls/rollout",
        "tokens/rollout",
        "failed",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in report["policies"].items():
        tokens = s["prompt_tokens_per_rollout"] + s["completion_tokens_per_rollout"]
        row = [
            name,
            _ci(s["mean_reward"]),
            _ci(s["success_rate"]),
            *(_ci(s["pass_at_k"][str(k)]) for k in ks),
            f"{s['calls_per_rollout']:.2f}",
            f"{tokens:.0f}",
            str(s["failed_rollouts"]),
        ]
        lines.append("| " + " | ".join(row) + " |")
    if report["comparisons"]:
        head = [
            "candidate − baseline",
            "mean reward",
            *(f"pass@{k}" for k in ks),
            "tasks gained",
            "tasks lost",
        ]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in report["comparisons"]:
            row = [
                f"{c['candidate']} − {c['baseline']}",
                _diff(c["mean_reward"]),
                *(_diff(c["pass_at_k"][str(k)]) for k in ks),
                str(len(c["flips"]["gained"])),
                str(len(c["flips"]["lost"])),
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Per-task success rate of each policy (bars, tasks sorted by the first policy), and each
    policy's pass@k curve with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = report["policies"]
    names = list(policies)
    n = report["settings"]["n"]
    ks = report["settings"]["k"]
    first = policies[names[0]]["tasks"]
    order = sorted(range(len(first)), key=lambda i: (first[i]["successes"], i))
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4), dpi=110, gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        rates = [policies[name]["tasks"][i]["successes"] / n for i in order]
        bars.bar([i + j * width for i in range(len(order))], rates, width, label=name)
    bars.set_xlabel(f"task (sorted by {names[0]})")
    bars.set_ylabel(f"successes / {n} samples")
    bars.set_ylim(0, 1.05)
    bars.legend(loc="upper left")
    bars.set_title("per-task success")
    for name in names:
        values = [policies[name]["pass_at_k"][str(k)] for k in ks]
        curves.errorbar(
            ks,
            [v["value"] for v in values],
            yerr=[
                [v["value"] - v["interval"][0] for v in values],
                [v["interval"][1] - v["value"] for v in values],
            ],
            marker="o",
            capsize=3,
            label=name,
        )
    curves.set_xlabel("k")
    curves.set_ylabel("pass@k (95 % bootstrap)")
    curves.set_xticks(ks)
    curves.set_ylim(0, 1.05)
    curves.grid(alpha=0.3)
    curves.set_title("pass@k")
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
