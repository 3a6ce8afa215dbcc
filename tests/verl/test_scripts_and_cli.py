"""The install and smoke scripts refuse clearly where they cannot work; `agl-train backend=verl`
takes the torch backend's config and fails on a bad one naming the key."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

NO_GPU = shutil.which("nvidia-smi") is None


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "usage: scripts/setup_verl.sh VERL_VERSION CUDA"),
        (
            ("0.8.0", "cu130"),
            "verl 0.8.0 is not supported: agentlightning.verl is written against verl 0.9.1",
        ),
        (("0.9.1", "cuda12"), "CUDA must look like cu128"),
    ],
)
def test_setup_verl_refuses_bad_arguments(args: tuple[str, ...], message: str) -> None:
    result = run("bash", "scripts/setup_verl.sh", *args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.skipif(not NO_GPU, reason="this machine has nvidia-smi: the scripts would really install/run")
@pytest.mark.parametrize("script", [("scripts/setup_verl.sh", "0.9.1", "cu128"), ("scripts/gpu_smoke.sh",)])
def test_scripts_refuse_without_a_gpu(script: tuple[str, ...]) -> None:
    result = run("bash", *script)
    assert result.returncode == 2
    assert "no NVIDIA GPU here" in result.stderr


def agl_train(*args: str) -> subprocess.CompletedProcess[str]:
    return run(sys.executable, "-m", "agentlightning.torch_backend.cli", *args)


def test_agl_train_backend_verl_fails_on_a_bad_config_naming_the_key(tmp_path: Path) -> None:
    torch_config = REPO / "agentlightning" / "config" / "train.yaml"
    result = agl_train(
        "backend=verl", "--config", str(torch_config), "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"
    )
    assert result.returncode == 2, result.stderr
    assert "actor_rollout_ref.actor.policy_loss.loss_mode must be per_rollout_mean" in result.stderr
    result = agl_train("backend=tensorflow")
    assert result.returncode == 2 and "backend must be torch or verl" in result.stderr
