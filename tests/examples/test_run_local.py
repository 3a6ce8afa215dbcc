"""`examples/calc_x/run_local.sh` end to end with the torch backend and the demo's tiny model
(random init, built in code): the script starts the Gateway and the Controller, trains two
steps of real AutoGen + MCP rollouts in the foreground, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agentlightning.procs import free_port
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON
from tests.learning import SIGNAL_HOOKS, assert_updates_with_signal

pytestmark = pytest.mark.process

SCRIPT = EXAMPLES / "calc_x" / "run_local.sh"
MARKER = "AGL_RUN_LOCAL_TEST"
TINY = [
    "--model",
    "demo",
    "data.train_batch_size=1",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.rollout.max_model_len=640",  # bounds what the random model generates
    "trainer.total_training_steps=2",
    "trainer.val_before_train=false",
    "trainer.save_freq=0",
    "trainer.logger=[console,jsonl]",
    "trainer.log_level=warning",
    # A random model earns no reward in two steps: a reward that differs within each group, so the
    # update these tests show has signal (tests/signal_hooks.py).
    f"agentlightning.hooks={SIGNAL_HOOKS}",
]


def _ours(marker: str) -> list[int]:
    """Live processes carrying this run's marker in their environment."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                needle in (entry / "environ").read_bytes()
                and (entry / "stat").read_text().split(") ")[1][0] not in "ZX"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _calculators() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"mcp_server_calculator" in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def _wait_gone(marker: str, before: set[int], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left, calculators = _ours(marker), _calculators() - before
        if not left and not calculators:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes left behind: {left} and MCP calculators {sorted(calculators)}")


def _start(tmp_path: Path, marker: str, *args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        MARKER: marker,
        "PYTHON": sys.executable,
        "AGENT_PYTHON": str(EXAMPLES_PYTHON),
        "AGL_PORT": str(free_port()),
        "RUN_DIR": str(tmp_path / "run"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a stray group we can still end by its id if the test fails
        # SIGINT as a terminal leaves it, or ignored as a background job of a non-interactive
        # shell starts it (`cmd &`, many CI runners); not as the test runner happened to start.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.SIG_DFL),
    )


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_run_local_trains_two_steps_and_cleans_up(tmp_path: Path, examples_python: str) -> None:
    marker, before = uuid.uuid4().hex, _calculators()
    proc = _start(tmp_path, marker, "--train-file", str(EXAMPLES / "calc_x" / "data" / "sample.jsonl"), *TINY)
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        _end(proc)
    assert proc.returncode == 0, output[-4000:]
    assert "Gateway     http://127.0.0.1:" in output and "Controller  pid" in output
    records = read_metrics(tmp_path / "run" / "trainer" / METRICS_FILE)
    steps = sorted({int(r["step"]) for r in records if "training/reward" in r})
    assert steps == [1, 2], records
    assert_updates_with_signal(records)
    agent_logs = list((tmp_path / "run" / "agents").glob("*/*.log"))
    assert len(agent_logs) >= 4  # 2 steps x 1 prompt x 2 rollouts ran as real agents
    _wait_gone(marker, before)


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "sigint-ignored"])
def test_ctrl_c_stops_everything(tmp_path: Path, examples_python: str, sigint_ignored: bool) -> None:
    """Started with SIGINT ignored, bash could not trap it: the run went on and exited 0
    (common.sh starts the script again with SIGINT restored)."""
    marker, before = uuid.uuid4().hex, _calculators()
    proc = _start(
        tmp_path,
        marker,
        "--train-file",
        str(EXAMPLES / "calc_x" / "data" / "sample.jsonl"),
        *TINY,
        sigint_ignored=sigint_ignored,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # until the Controller is up: three processes are running
            seen.append(line)
            if line.startswith("Controller  pid"):
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode == 130, ("".join(seen) + rest)[-4000:]
    _wait_gone(marker, before)
