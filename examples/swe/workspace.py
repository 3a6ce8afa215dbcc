"""The sandbox an agent's commands run in: its workspace at /workspace, Python + pytest, nothing else.

The harness process itself runs outside (it must reach the Gateway); every shell command it runs
for the model goes through `agent_sandbox(workdir).argv(["bash", "-c", command])`: no network, no
file outside the workspace writable, no other process visible, the task's source (and so its
hidden tests and reference fix) not mounted at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning.sandbox import Sandbox, python_paths


def task_python() -> str:
    """The interpreter the agent's `python` is: the one running this (it has pytest)."""
    return sys.executable


def agent_sandbox(workdir: str | Path, python: str | None = None, mount_at: str = "/workspace") -> Sandbox:
    python = python or task_python()
    bindir = str(Path(python).absolute().parent)
    return Sandbox(
        workspace=Path(workdir),
        mount_at=mount_at,
        read_only=python_paths(python),
        env={"PYTHONDONTWRITEBYTECODE": "1", "PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb"},
        path=f"{bindir}:/usr/local/bin:/usr/bin:/bin",
    )
