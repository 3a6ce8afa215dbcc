"""`agl-demo` end to end, shrunk to a few steps: three real processes (Gateway, Controller,
trainer) plus the agents, the PNG, the last line, and no process left behind — also on Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
from tests.controller.helpers import REPO, pid_alive

SMALL = [
    "warmup.steps=30",
    "train_problems=4",
    "val_problems=4",
    "agents_at_once=8",
    "train.trainer.total_training_steps=2",
    "train.trainer.test_freq=1",
    "train.data.train_batch_size=2",
    "train.actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "train.actor_rollout_ref.rollout.n=2",
]
LAST_LINE = re.compile(r"^validation reward: (\d+\.\d{3}) -> (\d+\.\d{3})$")


class DemoRun:
    """`agl-demo` as a child process whose output is read line by line as it comes."""

    def __init__(self, tmp_path: Path, *args: str, sigint_ignored: bool = False) -> None:
        argv = [sys.executable, "-m", "agentlightning.demo.cli", f"output_dir={tmp_path}", *SMALL, *args]
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # As a background job of a non-interactive shell starts it (`make test &`, CI runners).
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.extend(line.replace("\r", "\n").splitlines())

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "\n".join(self.lines[-30:])
            assert time.monotonic() < deadline, f"no {text!r} in time:\n" + "\n".join(self.lines[-30:])
            time.sleep(0.1)

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def pids(self) -> list[int]:
        """The pids the demo reported for the Gateway, the Controller and the trainer."""
        return [int(p) for line in self.lines for p in re.findall(r"\bpid (\d+)", line)]


def test_demo_trains_reports_and_stops_everything(tmp_path: Path) -> None:
    run = DemoRun(tmp_path)
    code = run.finish(timeout=180)
    output = "\n".join(run.lines)
    assert code == 0, output
    assert "Supervised warm-up (not RL)" in output  # the warm-up is said openly
    match = LAST_LINE.match(run.lines[-1])
    assert match, f"last line: {run.lines[-1]!r}"

    run_dir = tmp_path / "seed0"
    records = read_metrics(run_dir / METRICS_FILE)
    validations = [(r["step"], r["val/reward"]) for r in records if "val/reward" in r]
    assert [step for step, _ in validations] == [0, 1, 2]
    assert (f"{validations[0][1]:.3f}", f"{validations[-1][1]:.3f}") == match.groups()
    assert [r["step"] for r in records if "training/reward" in r] == [1, 2]
    assert all(r["training/n_rollouts"] == 4 for r in records if "training/reward" in r)
    assert (run_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    pids = run.pids()
    assert len(pids) == 3, output
    assert not [p for p in pids if pid_alive(p)]


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    # Started with SIGINT ignored, as from a background job: that made the demo ignore Ctrl-C
    # and finish with 0 when training was quick enough (the flaky `assert 0 == 130`).
    run = DemoRun(tmp_path, "train.trainer.total_training_steps=50", sigint_ignored=True)
    run.wait_for("[3/4] Trainer", timeout=300)
    pids = run.pids()
    assert len(pids) == 3
    # The dashboard link the demo printed opens the page, and its key reads the Gateway.
    (link,) = [m for line in run.lines for m in re.findall(r"Dashboard\s+(http://\S+/ui/)#key=(\S+)", line)]
    url, key = link
    assert httpx.get(url, timeout=30).text.startswith("<!doctype html>")
    overview = httpx.get(
        url.replace("/ui/", "/api/dashboard/overview"), headers={"x-api-key": key}, timeout=30
    )
    assert overview.status_code == 200 and "counts" in overview.json(), overview.text
    agents = tmp_path / "seed0" / "agents"
    deadline = time.monotonic() + 300
    while not (agents.is_dir() and any(agents.iterdir())):  # an agent has started: mid-training
        assert run.proc.poll() is None, "\n".join(run.lines[-30:])
        assert time.monotonic() < deadline, "no agent started in time"
        time.sleep(0.1)
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(timeout=180)
    output = "\n".join(run.lines[-40:])
    assert code == 130, output
    assert "interrupted" in run.lines[-1], output
    deadline = time.monotonic() + 10
    while [p for p in pids if pid_alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)]
