"""The three-process loop with rollouts served by real vLLM: `agl-demo engine=vllm`, two steps.

Gateway, Controller and trainer are processes; the trainer starts a vLLM server as its child,
registers it, publishes each step's weights into it (save → pause → drain → reload → reset
prefix cache → register → resume) and stops it at the end: no process is left behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.controller.helpers import pid_alive
from tests.e2e.test_demo import LAST_LINE, DemoRun

from .helpers import process_group_alive

pytestmark = pytest.mark.timeout(1200)


def test_demo_on_vllm_trains_two_steps_and_leaves_no_process(vllm_ready: str, tmp_path: Path) -> None:
    run = DemoRun(tmp_path, "engine=vllm")
    code = run.finish(timeout=1100)
    output = "\n".join(run.lines)
    assert code == 0, output
    assert "rollouts served by real vLLM" in output
    assert LAST_LINE.match(run.lines[-1]), run.lines[-1]

    run_dir = tmp_path / "seed0"
    records = read_metrics(run_dir / METRICS_FILE)
    assert [r["step"] for r in records if "val/reward" in r] == [0, 1, 2]
    steps = [r for r in records if "training/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["training/n_rollouts"] == 4 for r in steps)
    # Every rollout's calls were served and recorded (vLLM's token ids), and the merge held.
    for r in steps:
        assert r["training/n_turns"] >= 4 and r["training/n_calls_error"] == 0, r
        assert r["training/n_calls_no_log_probs"] == 0, r

    # The server ran from the run's folder, got two publishes, and the old weights are gone.
    vllm_dir = run_dir / "vllm"
    log = (vllm_dir / "servers" / "server0" / "server.log").read_text(errors="replace")
    assert sorted(p.name for p in (vllm_dir / "weights").iterdir()) == ["base", "v2"]
    assert (vllm_dir / "servers" / "server0" / "cache").is_dir()
    server_pids = {int(p) for p in re.findall(r"APIServer pid=(\d+)", log)}
    assert server_pids, log[-2000:]
    for pid in [*run.pids(), *server_pids]:
        assert not pid_alive(pid), f"pid {pid} is still running"
    assert not any(process_group_alive(pid) for pid in server_pids)
