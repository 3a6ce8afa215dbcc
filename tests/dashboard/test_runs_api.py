"""Training runs' metrics: the Tracker posts each step to a real Gateway, the API gives them back."""

from __future__ import annotations

import io
from pathlib import Path

import httpx

from agentlightning.client import GatewayClient, RetryPolicy
from agentlightning.procs import free_port
from agentlightning.trainer.tracking import Tracker, read_metrics
from tests.conftest import RunningGateway

KEY = "test-key"


def get(gw: RunningGateway, path: str) -> httpx.Response:
    return httpx.get(f"{gw.url}{path}", headers={"x-api-key": KEY})


def test_tracker_posts_every_step_to_the_gateway(gateway: RunningGateway, tmp_path: Path) -> None:
    with GatewayClient(gateway.url, KEY) as client:
        tracker = Tracker(["jsonl"], tmp_path, 3, experiment="exp-1", gateway=client)
        for step in (1, 2, 3):
            tracker.log({"training/reward": step / 10, "actor/kl": 0.01 * step, "skip": float("nan")}, step)
        tracker.close()
        # A run resumed from its step-1 checkpoint logs steps 2.. again: they replace the old ones.
        resumed = Tracker(["jsonl"], tmp_path, 3, first_step=1, experiment="exp-1", gateway=client)
        resumed.log({"training/reward": 0.9}, 2)
        resumed.close()

    runs = get(gateway, "/api/runs").json()
    assert [(r["run_id"], r["n_points"], r["last_step"]) for r in runs] == [("exp-1", 2, 2)]
    points = get(gateway, "/api/runs/exp-1/metrics").json()["points"]
    assert [p["step"] for p in points] == [1, 2]
    assert points[0]["metrics"] == {"training/reward": 0.1, "actor/kl": 0.01}  # NaN is not sent
    assert points[1]["metrics"] == {"training/reward": 0.9}
    # The same values as the trainer's own JSONL sink.
    assert [r["training/reward"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.1, 0.9]
    assert [p["step"] for p in get(gateway, "/api/runs/exp-1/metrics?after_step=1").json()["points"]] == [2]


def test_bad_posts_get_clear_errors(gateway: RunningGateway) -> None:
    url = f"{gateway.url}/api/runs/r1/metrics"
    headers = {"x-api-key": KEY}
    assert httpx.post(url, json=[{"step": 1, "metrics": {"a": 1}}]).status_code == 401
    for bad in ([{"step": -1, "metrics": {}}], [{"step": 1, "metrics": {"a": "high"}}], {"step": 1}):
        answer = httpx.post(url, json=bad, headers=headers)
        assert answer.status_code == 422, (bad, answer.text)
    answer = httpx.post(url, content=b'[{"step": 1, "metrics": {"a": NaN}}]', headers=headers)
    assert answer.status_code in (400, 422)
    answer = get(gateway, "/api/runs/nope/metrics")
    assert answer.status_code == 404 and "nope" in answer.json()["detail"]


def test_an_unreachable_gateway_does_not_stop_training(tmp_path: Path) -> None:
    dead = GatewayClient(f"http://127.0.0.1:{free_port()}", KEY, timeout=2, retry=RetryPolicy(attempts=1))
    with dead:
        tracker = Tracker(["jsonl"], tmp_path, 2, experiment="x", gateway=dead, stream=io.StringIO())
        tracker.log({"training/reward": 1.0}, 1)
        tracker.log({"training/reward": 0.5}, 2)
        tracker.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
