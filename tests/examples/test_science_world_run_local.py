"""`examples/science_world/run_local.sh` end to end with the torch backend and the demo's tiny
model (random init, built in code): the Gateway, the Controller and two asynchronous training
steps of real ScienceWorld rollouts (a simulator JVM each); then no process is left, JVMs
included; Ctrl-C exits 130."""

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
from tests.examples.test_run_local import MARKER, _end, _ours, _wait_gone
from tests.learning import SIGNAL_HOOKS, assert_updates_with_signal

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("java"),
]  # JVMs on a busy 2-core machine

SCRIPT = EXAMPLES / "science_world" / "run_local.sh"
SAMPLE = EXAMPLES / "science_world" / "data" / "sample.jsonl"
TINY = [
    "--train-file",
    str(SAMPLE),
    "--model",
    "demo",
    "data.train_batch_size=1",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.rollout.max_model_len=2048",  # the first prompt is ~1300 of its tokens
    "trainer.total_training_steps=2",
    f"agentlightning.hooks={SIGNAL_HOOKS}",  # a reward that differs within each group: an update with signal
    "trainer.save_freq=0",
    "trainer.logger=[console,jsonl]",
    "trainer.log_level=warning",
]
# The random model writes no action: a few turns until the token budget ends each episode.
AGENT_LIMITS = {"SCIENCE_WORLD_MAX_TOKENS": "16", "SCIENCE_WORLD_MAX_TOTAL_TOKENS": "1600"}


def _jvms(marker: str) -> list[int]:
    return [p for p in _ours(marker) if b"scienceworld.jar" in Path(f"/proc/{p}/cmdline").read_bytes()]


def _start(tmp_path: Path, marker: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        **AGENT_LIMITS,
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
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_run_local_trains_two_async_steps_and_leaves_no_process(tmp_path: Path, examples_python: str) -> None:
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker, *TINY)
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        _end(proc)
    assert proc.returncode == 0, output[-4000:]
    records = read_metrics(tmp_path / "run" / "trainer" / METRICS_FILE)
    steps = sorted({int(r["step"]) for r in records if "training/reward" in r})
    assert steps == [1, 2], records
    assert_updates_with_signal(records)
    agent_logs = list((tmp_path / "run" / "agents").glob("*/*.log"))
    assert len(agent_logs) >= 4  # 2 steps x 1 prompt x 2 rollouts ran as real agents
    _wait_gone(marker, set())  # Gateway, Controller, trainer, agents and their JVMs
    assert not _jvms(marker)


def test_ctrl_c_during_rollouts_exits_130_and_stops_the_jvms(tmp_path: Path, examples_python: str) -> None:
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker, *TINY)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Controller  pid"):
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        deadline = time.monotonic() + 600
        while not _jvms(marker):  # Ctrl-C while rollouts run, each with its simulator
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)[-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode == 130, ("".join(seen) + rest)[-4000:]
    _wait_gone(marker, set())
