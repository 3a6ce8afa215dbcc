"""`run_local.sh` of Search-R1 and LLM-in-Sandbox end to end with the torch backend and the demo's
tiny model (random init, built in code): each script starts its processes (Search-R1 also its
retrieval service), trains two steps of real rollouts in the foreground, and leaves no process
behind; Ctrl-C stops everything with 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from agentlightning.procs import free_port
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON
from tests.examples.test_run_local import MARKER, TINY, _end, _ours
from tests.learning import assert_updates_with_signal

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]  # a loaded 2-core machine needs more than 300 s


@dataclass(frozen=True)
class Example:
    name: str
    train_file: str
    # The random model writes no tags and calls no tools: keep its rollouts to two short calls.
    env: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()


EXAMPLE_LIST = [
    Example(
        "search_r1",
        "data/train.jsonl",
        {"SEARCH_R1_MAX_TURNS": "1", "SEARCH_R1_MAX_TOKENS": "32"},
        # The forced-answer call carries the first reply and the nudge: ~670 tokens, past TINY's 640
        # (a refused prompt is a context_overflow rollout, dropped from training).
        ("actor_rollout_ref.rollout.max_model_len=1024",),
    ),
    Example(
        "llm_in_sandbox",
        "data/train.jsonl",
        {"SANDBOX_MAX_TURNS": "2", "SANDBOX_MAX_TOKENS": "32"},
        ("actor_rollout_ref.rollout.max_model_len=2048",),  # the system prompt with five tools
    ),
]


def _wait_gone(marker: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := _ours(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"


def _start(example: Example, tmp_path: Path, marker: str, retrieval_port: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        **example.env,
        MARKER: marker,
        "PYTHON": sys.executable,
        "AGENT_PYTHON": str(EXAMPLES_PYTHON),
        "AGL_PORT": str(free_port()),
        "RETRIEVAL_PORT": str(retrieval_port),
        "RUN_DIR": str(tmp_path / "run"),
        "OMP_NUM_THREADS": "1",
        "AGL_START_TIMEOUT": "300",  # the Gateway's start on a loaded 2-core machine
    }
    here = EXAMPLES / example.name
    return subprocess.Popen(
        [
            "bash",
            str(here / "run_local.sh"),
            "--train-file",
            str(here / example.train_file),
            *TINY,
            *example.overrides,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=[e.name for e in EXAMPLE_LIST])
def test_run_local_trains_two_steps_and_cleans_up(
    example: Example, tmp_path: Path, examples_python: str
) -> None:
    marker, port = uuid.uuid4().hex, free_port()
    proc = _start(example, tmp_path, marker, port)
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
    episodes = [line for text in logs for line in text.splitlines() if " episode " in line]
    assert len(episodes) >= 4, logs  # 2 steps x 1 prompt x 2 rollouts ran as real agents
    _wait_gone(marker)
    if example.name == "search_r1":
        assert f"Retrieval   http://127.0.0.1:{port}/retrieve (pid" in output
        with pytest.raises(httpx.TransportError):  # the retrieval service is gone with its port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2, trust_env=False)


@pytest.mark.parametrize("example", EXAMPLE_LIST, ids=[e.name for e in EXAMPLE_LIST])
def test_ctrl_c_stops_everything(example: Example, tmp_path: Path, examples_python: str) -> None:
    marker = uuid.uuid4().hex
    proc = _start(example, tmp_path, marker, free_port())
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # until the Controller is up: all its processes are running
            seen.append(line)
            if line.startswith("Controller  pid"):
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(
            timeout=300
        )  # stopping four processes, each up to 20 s, on a loaded machine
    finally:
        _end(proc)
    assert proc.returncode == 130, ("".join(seen) + rest)[-4000:]
    _wait_gone(marker)
