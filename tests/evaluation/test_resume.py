"""agl-eval end to end on the demo task with a briefly warmed tiny model: the eval is SIGKILLed
while its rollouts run, the same command resumes it, and the report equals an uninterrupted
run's; the rollouts finished before the kill were found in the store, not run again."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning.client import GatewayClient
from agentlightning.demo.task import make_dataset
from agentlightning.demo.warmup import WarmupConfig, warmup
from agentlightning.procs import ManagedProcess
from agentlightning.tiny_model import build_tiny, save_tiny
from tests.conftest import start_gateway

REPO = Path(__file__).resolve().parents[2]
TASKS, N = 6, 3


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model after a short supervised warm-up: it calls the tool and is right on some
    problems (a random model's rewards would all be 0, and any two runs would agree)."""
    torch.set_num_threads(1)
    model, tokenizer = build_tiny(seed=0)
    warmup(model, tokenizer, WarmupConfig(steps=100, seed=0))
    return save_tiny(tmp_path_factory.mktemp("warm") / "model", model, tokenizer)


def eval_process(tmp_path: Path, out: Path, data: Path, warm: Path, log: str) -> ManagedProcess:
    argv = [
        sys.executable,
        "-m",
        "agentlightning.evaluation",
        f"data={data}",
        f"policies=[random=demo,warm={warm}]",
        f"n={N}",
        "agents_at_once=2",  # rollouts finish a few at a time: the kill lands mid-run
        f"output_dir={out}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return ManagedProcess("agl-eval", argv, tmp_path / log, env=env, cwd=REPO).start()


def finished(proc: ManagedProcess) -> str:
    assert proc.proc is not None
    assert proc.proc.wait(300) == 0, proc.log_tail(60)
    assert proc.log_path is not None
    return proc.log_path.read_text()


def numbers(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what differs between runs by nature (wall time)."""
    return {k: v for k, v in report.items() if k != "wall_seconds"}


@pytest.mark.process
@pytest.mark.timeout(900)  # a busy 2-core machine; alone it takes about a minute
def test_sigkill_mid_run_then_resume_gives_the_same_report(tmp_path: Path, warm_model: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    # Half "gets/finds ... more" problems (the warmed model adds, and is right on these), half
    # subtract or multiply ones (it is mostly wrong): some successes, some failures.
    pool = make_dataset(60, seed=11)
    adds = [t for t in pool if "more" in t["question"]][: TASKS // 2]
    others = [t for t in pool if "more" not in t["question"]][: TASKS - len(adds)]
    data.write_text("".join(json.dumps(t) + "\n" for t in adds + others))

    finished(eval_process(tmp_path, tmp_path / "ref", data, warm_model, "ref.log"))
    reference = json.loads((tmp_path / "ref" / "report.json").read_text())
    warm = reference["policies"]["warm"]
    # The warm model is right on some samples and wrong on others: the numbers say something.
    assert 0 < warm["success_rate"]["value"] < 1
    assert warm["calls_per_rollout"] >= 1 and warm["completion_tokens_per_rollout"] > 0
    assert len(reference["comparisons"]) == 1 and reference["comparisons"][0]["candidate"] == "warm"

    out = tmp_path / "crashed"
    first = eval_process(tmp_path, out, data, warm_model, "first.log")
    assert first.log_path is not None
    progress = re.compile(r"warm: ([1-9]\d*)/18 rollouts done")
    deadline = time.monotonic() + 300  # generous: a busy machine starts the services slowly
    while not progress.search(first.log_path.read_text()):
        assert first.alive(), first.log_tail(60)
        assert time.monotonic() < deadline, first.log_tail(60)
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)  # the eval only: its Gateway, Controller and engine live on
    assert first.proc is not None and first.proc.wait(10) == -signal.SIGKILL
    assert not (out / "report.json").exists()  # nothing presented as a result
    restarted_at = time.time()

    log = finished(eval_process(tmp_path, out, data, warm_model, "second.log"))
    assert "Stopped what a stopped agl-eval left running" in log
    assert "random: all 18 rollouts found finished in the store" in log
    found = int(re.search(r"warm: \d+/18 rollouts done \((\d+) found finished\)", log).group(1))  # type: ignore[union-attr]
    assert 1 <= found < 18
    resumed = json.loads((out / "report.json").read_text())
    assert numbers(resumed) == numbers(reference)  # every per-task reward, interval and flip

    # In the store: the rollouts found finished were created before the restart, ran once
    # (one attempt) and were not created again; only the others were created after it.
    gateway = start_gateway(tmp_path, "k", db_path=out / "gateway.db")
    try:
        with GatewayClient(gateway.url, "k") as client:
            ours = [
                r
                for r in client.list_rollouts(limit=1000)
                if (r.metadata.model_extra or {}).get("eval_policy") == "warm"
            ]
            assert len(ours) == TASKS * N
            before = [r for r in ours if r.status.created_at < restarted_at]
            assert len(before) == found
            for r in before:
                assert client.get_rollout(r.rollout_id).attempts == [r.status.last_attempt_id]
    finally:
        gateway.process.stop()
