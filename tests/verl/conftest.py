"""The verl tests run inside `.venv-verl` (verl 0.9.1 on CPU torch): `make test-verl`.

In any other interpreter (the main `.venv`, where verl is not installed) this folder is not
collected, so the main suite stays verl-free. If `.venv-verl` itself is missing the folder is
skipped with the reason — except on CI (`CI` set), where that is a failure: there the verl
tests must run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"

SKIP_REASON = f"verl is not installed here and {VERL_PYTHON} is missing: `make test-verl` creates it"

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("verl") is None:
    if VERL_PYTHON.exists():
        collect_ignore_glob = ["test_*.py"]  # `make test-verl` runs them in .venv-verl
    elif os.environ.get("CI"):
        raise pytest.UsageError(f"the verl tests must run on CI: {SKIP_REASON}")
    # else: each module's `pytest.importorskip("verl", reason=SKIP_REASON)` reports the skip


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Tiny models on a shared 2-core machine: more threads only contend (30× slower measured)."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
