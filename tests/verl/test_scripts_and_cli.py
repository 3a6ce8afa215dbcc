"""The install and smoke scripts refuse clearly where they cannot work; `agl-train backend=verl`
takes the torch backend's config and fails on a bad one naming the key."""

from __future__ import annotations

import shutil
import subprocess
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


def agl_train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`agl-train ARGS` in this process (the verl import is already paid for): exit code, stderr."""
    from agentlightning.commands.backends import main

    # keep the process's logging as it is: configured here, it would print to capsys' stream,
    # closed by the time later tests log
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.setattr("agentlightning.config.loader.configure_logging", lambda level: None)
        main(list(args))
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_agl_train_backend_verl_fails_on_a_bad_config_naming_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch_config = REPO / "agentlightning" / "config" / "train.yaml"
    code, err = agl_train(
        capsys,
        "backend=verl",
        "--config",
        str(torch_config),
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
    )
    assert code == 2, err
    assert "actor_rollout_ref.actor.policy_loss.loss_mode must be vanilla, gspo or cispo" in err
    code, err = agl_train(capsys, "backend=tensorflow")
    assert code == 2 and "backend must be torch or verl" in err
