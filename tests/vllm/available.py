"""Whether real vLLM can run here: its interpreter, or a skip with the reason (a failure on CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentlightning.torch_backend.vllm_server import vllm_python, vllm_unavailable


def vllm_python_or_skip() -> str:
    """The interpreter that runs vLLM (`.venv-vllm`); skips when there is none, fails on CI."""
    python = vllm_python()
    reason = vllm_unavailable(python)
    unavailable = Path(python).parent.parent / "UNAVAILABLE"  # `make vllm` failed: its log's tail
    if unavailable.exists():
        reason = f"{reason or ''}\n`make vllm` failed:\n{unavailable.read_text(errors='replace')[-1000:]}"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM must run on CI: {reason}")
        pytest.skip(f"real vLLM is not installed here: {reason}")
    return python
