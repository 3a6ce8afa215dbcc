"""Write ScienceWorld's rollout inputs: one row per (task, variation), split into train and val.

    .venv-examples/bin/python examples/science_world/sw_data.py [--out-dir DIR] \\
        [--tasks all|boil,melt,...] [--variations-per-task 50] [--val-fraction 0.2] \\
        [--simplification easy] [--split v1|scienceworld]

`--split v1` (the default) is v1.0's: every task of the installed package, the first
`min(variations_per_task, the task's variations)` variation indices, the last `val_fraction`
of them (at least one) for validation and the rest for training. `--split scienceworld` uses
the package's own split instead: its train variations for training and its dev variations for
validation (up to `variations_per_task` each). Everything comes from the `scienceworld`
package (its JAR holds the tasks): nothing is downloaded. The shipped data/train.jsonl and
data/val.jsonl are this script's defaults.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sw_env import ScienceWorldSession

HERE = Path(__file__).resolve().parent


def row(task_name: str, variation_idx: int, simplification: str) -> dict[str, Any]:
    return {
        "task_name": task_name,
        "variation_idx": variation_idx,
        "simplification": simplification,
        "data_source": "science_world",
    }


def v1_split(
    counts: dict[str, int], variations_per_task: int, val_fraction: float
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """v1.0's split: per task the first `budget` indices, the last `val_fraction` (>= 1) for val."""
    if variations_per_task < 2:
        raise ValueError("variations_per_task must be at least 2 (one for training, one for validation)")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    train, val = {}, {}
    for task, count in counts.items():
        budget = min(variations_per_task, count)
        n_val = max(1, int(budget * val_fraction))
        if budget - n_val < 1:
            raise ValueError(f"task {task!r} has {budget} variations: none left for training")
        train[task] = list(range(budget - n_val))
        val[task] = list(range(budget - n_val, budget))
    return train, val


def collect(tasks: str, split: str, variations_per_task: int) -> dict[str, Any]:
    """Ask the simulator (one JVM) for the tasks, their variation counts and its own split."""
    with ScienceWorldSession("boil", 0) as session:
        env = session._env
        names = list(env.get_task_names())
        chosen = names if tasks == "all" else [t.strip() for t in tasks.split(",") if t.strip()]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise SystemExit(f"unknown tasks {unknown}; tasks: {', '.join(names)}")
        counts = {t: int(env.get_max_variations(t)) for t in chosen}
        own: dict[str, tuple[list[int], list[int]]] = {}
        if split == "scienceworld":
            for task in chosen:
                env.load(task, 0, "")
                own[task] = (
                    list(env.get_variations_train())[:variations_per_task],
                    list(env.get_variations_dev())[:variations_per_task],
                )
    return {"counts": counts, "own": own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--tasks", default="all", help="'all' or comma-separated task names")
    parser.add_argument("--variations-per-task", type=int, default=50)
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--simplification", default="easy")
    parser.add_argument("--split", choices=("v1", "scienceworld"), default="v1")
    args = parser.parse_args()
    found = collect(args.tasks, args.split, args.variations_per_task)
    if args.split == "v1":
        train, val = v1_split(found["counts"], args.variations_per_task, args.val_fraction)
    else:
        train = {t: pair[0] for t, pair in found["own"].items()}
        val = {t: pair[1] for t, pair in found["own"].items()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, table in (("train", train), ("val", val)):
        rows = [row(t, v, args.simplification) for t, variations in table.items() for v in variations]
        path = args.out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{path}: {len(rows)} rows over {len(table)} tasks")


if __name__ == "__main__":
    main()
