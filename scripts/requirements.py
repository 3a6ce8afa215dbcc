"""Print the requirements of the core and of the named extras in pyproject.toml, one a line.

`make` installs them into each venv before the package itself, so that the venvs build side by
side (`make -j`): only the quick `pip install --no-deps -e .` steps, which all write the source
tree's `agentlightning.egg-info`, take turns (under `flock`).

    python3 scripts/requirements.py train dev > requirements.txt
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"
    ]
    optional = project["optional-dependencies"]
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"no extra {unknown[0]!r} in pyproject.toml (extras: {', '.join(optional)})")
    return [*project["dependencies"], *(r for e in extras for r in optional[e])]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
