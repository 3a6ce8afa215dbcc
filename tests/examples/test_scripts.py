"""What can be checked here of the examples' scripts and the Calc-X image without Docker or minikube:
every script's shell syntax and shellcheck, hadolint on the Dockerfile and the files it copies, the
image's build-time calculator check run in the examples' venv, the run_minikube.sh scripts' refusal
without minikube, and what Calc-X's and SWE's run_minikube.sh ask of minikube (a stand-in that
records it)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from agentlightning.procs import free_port
from tests.examples.k8s_example import check_dockerfile
from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON, REPO
from tests.examples.test_run_local import MARKER, _ours

CALC_X = EXAMPLES / "calc_x"
SCRIPTS = sorted(EXAMPLES.glob("*/*.sh"))
MINIKUBE_SCRIPTS = sorted(EXAMPLES.glob("*/run_minikube.sh"))


def _tool(name: str) -> str:
    path = EXAMPLES_PYTHON.parent / name
    assert path.exists(), f"{path} is missing: `make examples-venv` installs it (extra examples_lint)"
    return str(path)


def _name(script: Path) -> str:
    return f"{script.parent.name}/{script.name}"


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_shell_syntax(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_shellcheck(script: Path, examples_python: str) -> None:
    # From the script's folder: the `source` lines are relative to it.
    result = subprocess.run(
        [_tool("shellcheck"), "-x", script.name], cwd=script.parent, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_and_every_file_the_image_copies_exists(examples_python: str) -> None:
    check_dockerfile(CALC_X)


def test_the_images_calculator_check_passes(examples_python: str) -> None:
    result = subprocess.run(
        [examples_python, "check_calculator.py"], cwd=CALC_X, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MCP calculator ok: tools ['calculate']" in result.stdout


def _path_with(tmp_path: Path, tools: tuple[str, ...]) -> Path:
    """A folder of links to these system tools, to be the whole PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        for folder in ("/usr/bin", "/bin"):
            if Path(folder, tool).exists():
                (bin_dir / tool).symlink_to(Path(folder, tool))
                break
    return bin_dir


@pytest.mark.parametrize("script", MINIKUBE_SCRIPTS, ids=_name)
def test_run_minikube_refuses_clearly_without_minikube(script: Path, tmp_path: Path) -> None:
    bin_dir = _path_with(tmp_path, ("dirname", "basename", "mkdir", "seq", "sleep", "tail"))  # no minikube
    env = {**os.environ, "PATH": str(bin_dir), "RUN_DIR": str(tmp_path / "run")}
    result = subprocess.run(
        ["/bin/bash", str(script), "--train-file", "x.jsonl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "minikube is not installed" in result.stderr
    assert not (tmp_path / "run" / "gateway.log").exists()  # nothing was started


# A minikube that is running, builds nothing and records what it was asked; the node resolves
# host.minikube.internal; `kubectl apply -f -` keeps what it was given.
FAKE_MINIKUBE = """#!/bin/bash
echo "$*" >> "$RECORD/calls"
case "$1" in
  ssh) echo "192.168.49.1    STREAM host.minikube.internal" ;;
  kubectl) cat > "$RECORD/applied.json" ;;
esac
"""


def run_minikube_script(
    script: Path, tmp_path: Path, marker: str, port: int
) -> subprocess.CompletedProcess[str]:
    """An example's run_minikube.sh against the recording minikube (FAKE_MINIKUBE), its training
    given a file that does not exist; what it started carries `marker`, its run folder is
    tmp_path/run."""
    tools = ("dirname", "basename", "mkdir", "seq", "sleep", "tail", "cat", "awk", "sed")
    bin_dir = _path_with(tmp_path, tools)
    (bin_dir / "minikube").write_text(FAKE_MINIKUBE)
    (bin_dir / "minikube").chmod(0o755)
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "RUN_DIR": str(tmp_path / "run"),
        "RECORD": str(tmp_path),
        "AGL_PORT": str(port),
        MARKER: marker,
    }
    return subprocess.run(
        ["/bin/bash", str(script), "--train-file", str(tmp_path / "missing.jsonl")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_calc_x_run_minikube_builds_the_image_from_the_repository_root(tmp_path: Path) -> None:
    """The agent imports agentlightning/agent_events.py, so its image is built from the repository
    root with the example's Dockerfile; then the Gateway, the Controller and the training (here
    refused at once: no such file), after which nothing it started is left."""
    marker = uuid.uuid4().hex
    result = run_minikube_script(CALC_X / "run_minikube.sh", tmp_path, marker, free_port())
    assert result.returncode != 0  # the training refused the missing file
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["status", f"image build -t agl-calc-x:latest -f examples/calc_x/Dockerfile {REPO}"]
    assert "k8s" in (tmp_path / "run" / "controller.log").read_text()  # the Kubernetes runner
    assert not _ours(marker), "processes left behind"


def test_swe_run_minikube_builds_the_image_and_lets_the_agents_reach_only_the_gateway(tmp_path: Path) -> None:
    """Everything run_minikube.sh does before the cluster runs Jobs, against a recording minikube:
    the image built from the repository root with the example's Dockerfile, the agents' egress
    policy applied with the host's Gateway as its one address on the Gateway's port, then the
    Gateway, the Controller with the k8s runner, and the training (here refused at once: no such
    file), after which nothing it started is left."""
    port = free_port()
    run_dir = tmp_path / "run"
    marker = uuid.uuid4().hex
    result = run_minikube_script(EXAMPLES / "swe" / "run_minikube.sh", tmp_path, marker, port)
    assert result.returncode != 0  # the training refused the missing file
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[:2] == ["status", f"image build -t agl-swe:latest -f examples/swe/Dockerfile {REPO}"]
    assert calls[2] == "ssh -- getent ahostsv4 host.minikube.internal"
    assert calls[3] == "kubectl -- apply -n default -f -"
    policy = json.loads((tmp_path / "applied.json").read_text())
    assert policy["spec"]["egress"][0] == {
        "to": [{"ipBlock": {"cidr": "192.168.49.1/32"}}],
        "ports": [{"protocol": "TCP", "port": port}],
    }
    shipped = yaml.safe_load((EXAMPLES / "swe" / "network-policy.yaml").read_text())["spec"]
    for key in ("podSelector", "policyTypes", "ingress"):  # the same pods, no connection to them
        assert policy["spec"][key] == shipped[key]
    assert policy["spec"]["egress"][1:] == shipped["egress"][1:]  # and DNS, nothing else
    controller = (run_dir / "controller.log").read_text()
    assert "k8s" in controller, controller  # the Controller ran with the Kubernetes runner
    assert not _ours(marker), "processes left behind"
