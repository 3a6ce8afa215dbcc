"""What can be checked here of the Calc-X scripts and image without Docker or minikube:
shell syntax and shellcheck, hadolint on the Dockerfile, the image's build-time calculator
check run in the examples' venv, and run_minikube.sh's refusal without minikube."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentlightning.testing.example_stack import EXAMPLES, EXAMPLES_PYTHON

CALC_X = EXAMPLES / "calc_x"
SCRIPTS = [CALC_X / "run_local.sh", CALC_X / "run_minikube.sh", CALC_X / "common.sh"]


def _tool(name: str) -> str:
    path = EXAMPLES_PYTHON.parent / name
    assert path.exists(), f"{path} is missing: `make examples-venv` installs it (extra examples_lint)"
    return str(path)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_syntax(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_shellcheck(examples_python: str) -> None:
    result = subprocess.run(
        [_tool("shellcheck"), "-x", *(p.name for p in SCRIPTS)], cwd=CALC_X, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint(examples_python: str) -> None:
    result = subprocess.run([_tool("hadolint"), "Dockerfile"], cwd=CALC_X, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_images_calculator_check_passes(examples_python: str) -> None:
    result = subprocess.run(
        [examples_python, "check_calculator.py"], cwd=CALC_X, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MCP calculator ok: tools ['calculate']" in result.stdout


def test_run_minikube_refuses_clearly_without_minikube(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with bash's basics but no minikube
    bin_dir.mkdir()
    for tool in ("dirname", "basename", "mkdir", "seq", "sleep", "tail"):
        for folder in ("/usr/bin", "/bin"):
            if Path(folder, tool).exists():
                (bin_dir / tool).symlink_to(Path(folder, tool))
                break
    env = {**os.environ, "PATH": str(bin_dir), "RUN_DIR": str(tmp_path / "run")}
    result = subprocess.run(
        ["/bin/bash", str(CALC_X / "run_minikube.sh"), "--train-file", "x.jsonl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "minikube is not installed" in result.stderr
    assert not (tmp_path / "run" / "gateway.log").exists()  # nothing was started
