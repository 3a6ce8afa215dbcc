"""services.json: a restart stops what a killed eval left running (by pid, start time checked)
and refuses to run beside a live eval on the same folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentlightning.evaluation.cli import SERVICES_FILE, EvalError, ServiceLedger, _start_time
from agentlightning.procs import ManagedProcess


def sleeper(tmp_path: Path, name: str) -> ManagedProcess:
    return ManagedProcess(
        name, [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / f"{name}.log"
    ).start()


def test_leftovers_are_stopped_and_reused_pids_spared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    left = sleeper(tmp_path, "gateway")
    reused = sleeper(tmp_path, "other")  # its pid recorded with another start time: not ours any more
    try:
        services = [
            {"name": "gateway", "pid": left.pid, "start": _start_time(left.pid)},
            {"name": "controller", "pid": reused.pid, "start": "1"},
        ]
        (tmp_path / SERVICES_FILE).write_text(
            json.dumps({"eval": {"pid": 1, "start": "1"}, "services": services})
        )
        ServiceLedger(tmp_path).claim()
        assert left.proc is not None and left.proc.wait(30) is not None  # SIGKILLed by the claim
        assert reused.alive()
        assert f"gateway (pid {left.pid})" in capsys.readouterr().out
        assert json.loads((tmp_path / SERVICES_FILE).read_text())["services"] == []
    finally:
        left.stop()
        reused.stop()


def test_a_live_eval_on_the_folder_is_refused(tmp_path: Path) -> None:
    other = sleeper(tmp_path, "agl-eval")
    try:
        owner = {"pid": other.pid, "start": _start_time(other.pid)}
        (tmp_path / SERVICES_FILE).write_text(json.dumps({"eval": owner, "services": []}))
        with pytest.raises(EvalError, match=f"another agl-eval \\(pid {other.pid}\\) is running"):
            ServiceLedger(tmp_path).claim()
        assert other.alive()
    finally:
        other.stop()
