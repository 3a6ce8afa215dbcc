"""Agent log retention: failed attempts' logs and the others' are kept in two budgets."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agentlightning.client import GatewayClient
from agentlightning.controller.config import load_controller_config
from agentlightning.controller.log_retention import LogRetention
from agentlightning.schemas import Model
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import (
    GATEWAY_OVERRIDES,
    local_config,
    start_controller,
    wait_terminal,
    wait_until,
)
from tests.fakes.model_server import FakeModelServer

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "logs-key"
AGENTS = "tests.controller.agents"


def attempt_log(log_dir: Path, rollout: str, mtime: float) -> Path:
    path = log_dir / rollout / "attempt-1.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"output of {rollout}\n")
    os.utime(path, (mtime, mtime))
    return path


def logs(log_dir: Path) -> set[str]:
    return {p.parent.name for p in log_dir.glob("*/*.log") if p.parent.name != "_warm"}


def test_keeps_the_newest_of_each_kind_and_deletes_emptied_directories(tmp_path: Path) -> None:
    retention = LogRetention(tmp_path, keep=2, keep_failed=1)
    retention.load()
    for i in range(4):
        retention.finished(attempt_log(tmp_path, f"ok{i}", 1000 + i), failed=False)
    for i in range(3):
        retention.finished(attempt_log(tmp_path, f"bad{i}", 2000 + i), failed=True)
    assert logs(tmp_path) == {"ok2", "ok3", "bad2"}
    assert not (tmp_path / "ok0").exists()  # the rollout's directory went with its last file
    assert (tmp_path / "bad2" / "attempt-1.failed").exists()


def test_a_restart_sorts_the_logs_on_disk_into_the_same_budgets(tmp_path: Path) -> None:
    first = LogRetention(tmp_path, keep=-1, keep_failed=-1)  # -1: keep all
    first.load()
    for i in range(3):
        first.finished(attempt_log(tmp_path, f"ok{i}", 1000 + i), failed=False)
        first.finished(attempt_log(tmp_path, f"bad{i}", 1000 + i), failed=True)
    (tmp_path / "_warm").mkdir()
    (tmp_path / "_warm" / "x.log").write_text("warm process")
    assert len(logs(tmp_path)) == 6

    LogRetention(tmp_path, keep=1, keep_failed=2).load()
    assert logs(tmp_path) == {"ok2", "bad1", "bad2"}
    assert (tmp_path / "_warm" / "x.log").exists()


@pytest.mark.parametrize("key", ["keep_logs", "keep_failed_logs"])
def test_a_bad_setting_fails_at_start_naming_it(key: str) -> None:
    with pytest.raises(ValueError, match=f"local_runner.{key}"):
        load_controller_config({"local_runner": {key: -2}})


def test_the_controller_keeps_the_last_logs_of_each_kind(tmp_path: Path) -> None:
    gw: RunningGateway = start_gateway(tmp_path, KEY, *GATEWAY_OVERRIDES)
    log_dir = tmp_path / "logs"
    controller = start_controller(
        gw.url, KEY, log_dir, "local_runner.keep_logs=2", "local_runner.keep_failed_logs=1"
    )
    try:
        with FakeModelServer() as fake, GatewayClient(gw.url, KEY) as client:
            client.register_models([Model(model="policy", endpoint=fake.base_url)])
            ok = [f"ok-{uuid.uuid4().hex[:8]}" for _ in range(5)]
            bad = [f"bad-{uuid.uuid4().hex[:8]}" for _ in range(3)]
            specs = [
                {"rollout_id": r, "input": None, "config": local_config(f"{AGENTS}.RewardAgent")} for r in ok
            ]
            specs += [
                {"rollout_id": r, "input": None, "config": local_config(f"{AGENTS}.CrashAgent")} for r in bad
            ]
            client.create_rollouts(specs)
            done = wait_terminal(client, ok + bad, timeout=120)
            assert {done[r].status.state for r in ok} == {"succeeded"}
            assert {done[r].status.state for r in bad} == {"failed"}
            kept = wait_until(lambda: (lambda s: s if len(s) == 3 else None)(logs(log_dir)), timeout=60)
            assert len(kept & set(ok)) == 2 and len(kept & set(bad)) == 1
    finally:
        controller.stop()
        gw.process.stop()
