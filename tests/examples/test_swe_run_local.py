"""examples/swe/run_local.sh end to end with the torch backend and the demo's tiny model (random init,
built in code): it starts the Gateway and the Controller, trains two steps of real mini-swe-agent
rollouts (every command in bubblewrap, each graded by the hidden tests) in the foreground, and
leaves no process behind, the sandboxes included; Ctrl-C stops everything with 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agentlightning.procs import free_port
from agentlightning.sandbox import available
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.examples.stack import EXAMPLES, REPO
from tests.examples.test_run_local import MARKER, TINY, _end, _ours
from tests.heavy import require
from tests.learning import assert_updates_with_signal

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]
SWE = EXAMPLES / "swe"
SWE_PYTHON = REPO / ".venv-swe" / "bin" / "python"
# The random model writes no tool call: each rollout is one call, then mini stops at its step limit.
ARGS = [
    "--train-file",
    str(SWE / "data" / "train.jsonl"),
    *TINY,
    "actor_rollout_ref.rollout.max_model_len=2800",  # mini's prompt is ~2,400 tokens: ~400 generated
]


def _need() -> None:
    require([m for m, ok in (("bubblewrap", available()), (".venv-swe", SWE_PYTHON.exists())) if not ok])


def _sandboxed(tmp: Path) -> list[int]:
    """Live processes whose command line names this run's temporary folder: the sandboxes (bwrap
    starts them with an empty environment, so the marker is not in theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(tmp).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _wait_gone(marker: str, tmp: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := _ours(marker) + _sandboxed(tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def _start(tmp_path: Path, marker: str) -> subprocess.Popen[str]:
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        MARKER: marker,
        "PYTHON": sys.executable,
        "SWE_PYTHON": str(SWE_PYTHON),
        "AGL_PORT": str(free_port()),
        "RUN_DIR": str(tmp_path / "run"),
        "TMPDIR": str(tmp_path / "tmp"),  # the agents' workspaces: their sandboxes' command lines name it
        "OMP_NUM_THREADS": "1",
        "AGL_START_TIMEOUT": "300",
        "SWE_STEP_LIMIT": "1",  # one model call a rollout
    }
    return subprocess.Popen(
        ["bash", str(SWE / "run_local.sh"), *ARGS],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_run_local_trains_two_steps_and_cleans_up(tmp_path: Path) -> None:
    _need()
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker)
    try:
        output, _ = proc.communicate(timeout=850)
    finally:
        _end(proc)
    assert proc.returncode == 0, output[-4000:]
    records = read_metrics(tmp_path / "run" / "trainer" / METRICS_FILE)
    steps = sorted({int(r["step"]) for r in records if "training/reward" in r})
    assert steps == [1, 2], records
    assert_updates_with_signal(records)
    logs = [p.read_text() for p in (tmp_path / "run" / "agents").glob("*/*.log")]
    graded = [
        json.loads(line) for text in logs for line in text.splitlines() if line.startswith('{"instance_id"')
    ]
    assert len(graded) >= 4, logs  # 2 steps x 1 task x 2 rollouts ran as real agents and were graded
    assert all(g["reward"] == 0.0 for g in graded)  # a random model fixes nothing
    _wait_gone(marker, tmp_path / "tmp")


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    _need()
    marker = uuid.uuid4().hex
    proc = _start(tmp_path, marker)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Controller  pid"):
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
    finally:
        _end(proc)
    assert proc.returncode == 130, ("".join(seen) + rest)[-4000:]
    _wait_gone(marker, tmp_path / "tmp")
