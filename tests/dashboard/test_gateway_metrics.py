"""`GET /metrics` of a real Gateway, parsed with prometheus-client's text parser: the values
match the traffic the test sent (calls by mode and status, retries, pause, rollouts, events)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from agentlightning.client import GatewayClient
from agentlightning.schemas import Model, RolloutCreate
from tests.conftest import RunningGateway, start_gateway
from tests.fakes.model_server import FakeModelServer, Reply

KEY = "metrics-key"
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "what is two plus two"}]


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def scrape(gw: RunningGateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = httpx.get(f"{gw.url}/metrics", headers={"x-api-key": KEY})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sdk(gw: RunningGateway, rollout_id: str, mode: str) -> openai.OpenAI:
    base = f"{gw.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/{mode}/openai/v1"
    return openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)


def test_metrics_match_the_traffic(tmp_path: Path, fake: FakeModelServer) -> None:
    gw = start_gateway(tmp_path, KEY, "proxy.backoff_seconds=0.01", "proxy.max_backoff_seconds=0.02")
    try:
        assert httpx.get(f"{gw.url}/metrics").status_code == 401  # the key is needed, as everywhere
        with GatewayClient(gw.url, KEY) as client:
            client.register_models([Model(model="policy", endpoint=fake.base_url, version=3)])
            ids = [f"m-{uuid.uuid4().hex[:8]}" for _ in range(3)]
            client.create_rollouts([RolloutCreate(rollout_id=r, input={}) for r in ids])
            client.patch_rollout(ids[0], state="running")
            client.patch_rollout(ids[1], state="running")
            client.patch_rollout(ids[1], state="succeeded")

            for _ in range(3):
                sdk(gw, ids[0], "train").chat.completions.create(model="m", messages=USER)
            sdk(gw, ids[0], "val").chat.completions.create(model="m", messages=USER)
            fake.script(Reply(status=503, times=2), Reply(content="third time lucky"))
            sdk(gw, ids[0], "train").chat.completions.create(model="m", messages=USER)
            fake.script(Reply(status=400))
            with pytest.raises(openai.BadRequestError):
                sdk(gw, ids[0], "train").chat.completions.create(model="m", messages=USER)
            client.post_event(ids[0], "a1", "reward", {"value": 1.0})

            client.pause(retry_after_seconds=1, reason="test")
            with pytest.raises(openai.RateLimitError):
                sdk(gw, ids[0], "val").chat.completions.create(model="m", messages=USER)
            paused = scrape(gw)
            client.resume()
        after = scrape(gw)
    finally:
        gw.process.stop()

    def calls(mode: str, status: str) -> float:
        return after.get(("agl_proxy_calls_total", (("mode", mode), ("status", status))), 0.0)

    assert calls("train", "200") == 4
    assert calls("train", "400") == 1
    assert calls("val", "200") == 1
    assert calls("val", "429") == 1
    assert after[("agl_proxy_retries_total", ())] == 2
    assert after[("agl_proxy_paused_answers_total", ())] == 1
    assert after[("agl_proxy_latency_seconds_count", (("mode", "train"),))] == 5
    assert after[("agl_proxy_upstream_latency_seconds_count", ())] == 6
    assert after[("agl_proxy_latency_seconds_sum", (("mode", "train"),))] > 0
    assert paused[("agl_proxy_paused", ())] == 1 and after[("agl_proxy_paused", ())] == 0
    assert after[("agl_proxy_inflight", ())] == 0
    assert after[("agl_rollouts", (("state", "queuing"),))] == 1
    assert after[("agl_rollouts", (("state", "running"),))] == 1
    assert after[("agl_rollouts", (("state", "succeeded"),))] == 1
    assert after[("agl_events_written_total", (("type", "model_request"),))] == 6
    assert after[("agl_events_written_total", (("type", "reward"),))] == 1
    assert after[("agl_store_latency_seconds_count", (("op", "append_event"),))] == 7
    assert after[("agl_store_latency_seconds_count", (("op", "patch_rollout"),))] == 3


def test_metrics_can_be_switched_off(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, KEY, "metrics.enabled=false")
    try:
        answer = httpx.get(f"{gw.url}/metrics", headers={"x-api-key": KEY})
        assert answer.status_code == 404
        assert "metrics.enabled" in answer.json()["detail"]
    finally:
        gw.process.stop()


def test_fast_histogram_matches_prometheus_client() -> None:
    """The Gateway's lock-free histogram exposes exactly what prometheus-client's would."""
    from prometheus_client import CollectorRegistry, Histogram

    from agentlightning.server.metrics import CALL_BUCKETS, FastHistogram

    values = [0.0, 0.005, 0.0051, 0.1, 0.25, 1.0, 7.5, 599.9, 600.0, 601.0, 1e9]
    registry = CollectorRegistry()
    reference = Histogram("h", "h", buckets=CALL_BUCKETS, registry=registry)
    ours = FastHistogram(CALL_BUCKETS)
    for v in values:
        reference.observe(v)
        ours.observe(v)
    (family,) = registry.collect()
    expected = [(s.labels["le"], s.value) for s in family.samples if s.name == "h_bucket"]
    assert ours.buckets() == expected
    assert ours.sum == pytest.approx(sum(values))
