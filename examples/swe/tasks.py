"""The task bank's command line.

    python -m examples.swe.tasks list [--seed S] [--family F]     task ids, one a line
    python -m examples.swe.tasks show ID                          the task as one JSON object (no hidden tests)
    python -m examples.swe.tasks checkout ID DIR                  the workspace the agent sees, into new DIR
    python -m examples.swe.tasks grade ID DIR [--partial] [--timeout S] [--no-sandbox]
                                                                  one JSON object: reward and test outcomes
    python -m examples.swe.tasks solution ID                      the reference patch (a unified diff)

`--tasks FILE.jsonl` reads SWE-bench / SWE-smith instances instead of the generated bank; those
without a repository snapshot need their image to check out and grade (not on this machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from examples.swe.bank import BANK_SIZE, bank, find
from examples.swe.grader import grade
from examples.swe.task import Task, load_jsonl


def checkout(task: Task, directory: str | Path) -> Path:
    """Write the agent's workspace (the snapshot: no hidden tests, no git history) into a new folder."""
    if not task.files:
        raise ValueError(
            f"{task.instance_id}: no repository snapshot (its image is {task.image_name or 'unknown'})"
        )
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=False)
    for rel, text in task.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "ISSUE.md").write_text(task.problem_statement)
    return root


def _lookup(args) -> Task:
    if args.tasks:
        for task in load_jsonl(args.tasks):
            if task.instance_id == args.id:
                return task
        raise KeyError(f"no task {args.id!r} in {args.tasks}")
    return find(args.id, args.size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.tasks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", help="a SWE-bench / SWE-smith JSONL file instead of the generated bank")
    parser.add_argument("--size", type=int, default=BANK_SIZE, help="tasks in the generated bank per seed")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family")
    for name in ("show", "solution", "checkout", "grade"):
        p = sub.add_parser(name)
        p.add_argument("id")
        if name in ("checkout", "grade"):
            p.add_argument("dir")
        if name == "grade":
            p.add_argument("--partial", action="store_true", help="reward the fraction of tests passed")
            p.add_argument("--timeout", type=float, default=120.0)
            p.add_argument("--no-sandbox", action="store_true", help="run the tests without bubblewrap")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            tasks = load_jsonl(args.tasks) if args.tasks else bank(args.seed, args.size)
            for task in tasks:
                if args.family is None or task.family == args.family:
                    print(task.instance_id)
            return 0
        task = _lookup(args)
        if args.command == "show":
            data = task.to_json()
            for hidden in ("hidden_files", "test_patch", "patch"):
                data.pop(hidden)
            print(json.dumps(data, indent=1))
        elif args.command == "solution":
            sys.stdout.write(task.patch)
        elif args.command == "checkout":
            print(checkout(task, args.dir))
        elif args.command == "grade":
            result = grade(task, args.dir, timeout=args.timeout, partial=args.partial,
                           sandbox=False if args.no_sandbox else None)  # fmt: skip
            print(json.dumps(dataclasses.asdict(result)))
    except (KeyError, ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"examples.swe.tasks: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
