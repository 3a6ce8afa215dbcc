"""The hooks file of tests/trainer/test_hooks.py is a v1.0.2 hooks file: v1.0.2's own loader
takes it and its on_enqueue works on v1.0.2's RolloutCreate."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.compat.conftest import v1_env
from tests.trainer.test_hooks import HOOKS_V1

CHECK = """
import sys
from agentlightning.hooks import load_hooks
from agentlightning.schemas import RolloutCreate
hooks = load_hooks(sys.argv[1])
hooks.on_startup()
request = hooks.on_enqueue(RolloutCreate(input={"k": 1}, config={"timeout_seconds": 5}, metadata={}))
print(type(hooks).__name__, request.config.timeout_seconds)
"""


def test_the_hooks_file_is_a_v1_hooks_file(v1_bin: Path, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    hooks.write_text(HOOKS_V1)
    done = subprocess.run(
        [str(v1_bin / "python"), "-c", CHECK, str(hooks)],
        cwd=tmp_path,
        env=v1_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RewardFromTrace", "120"]
