"""`agl init DIR`: write a working starter into a new folder.

    agl init my_agent && agl train my_agent/config.yaml

DIR gets `agent.py` (a plain `openai` agent with one tool that posts its reward with the rollout's
key), `train.jsonl` and `val.jsonl` (a few tasks) and `config.yaml` (commented; the built-in tiny
model, so that `agl train` runs it on CPU). DIR must not exist or be empty: nothing is overwritten.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from agentlightning.config.loader import fail

PROG = "agl init"
STARTER = ("agent.py", "config.yaml", "train.jsonl", "val.jsonl")
USAGE = "usage: agl init DIR\n\n" + (__doc__ or "").split("\n\n", 2)[2].strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        fail(PROG, f"expected one folder to create, got {args or 'none'} ({USAGE.splitlines()[0]})")
    target = Path(args[0])
    if target.exists() and not target.is_dir():
        fail(PROG, f"{target} exists and is not a folder; choose a new name")
    if target.is_dir() and any(target.iterdir()):
        fail(PROG, f"{target} exists and is not empty; choose a new folder (nothing was written)")
    target.mkdir(parents=True, exist_ok=True)
    source = resources.files("agentlightning.commands") / "starter"
    for name in STARTER:
        (target / name).write_bytes((source / name).read_bytes())
    print(
        f"{PROG}: wrote {', '.join(STARTER)} into {target}\n"
        f"Train it (local Gateway and Controller, the tiny model, CPU):  agl train {target / 'config.yaml'}"
    )
    return 0
