"""An agent's `max_tokens` past the served context is lowered to it (proxy/context.py): vLLM refuses
`max_tokens` above `max_model_len` with a 400 that ends a harness's run (Claude Code asks 32000 of
every model). The real vLLM case is tests/vllm/test_agent_apis.py; here a fake upstream that lists
its context in GET /v1/models, as vLLM does, shows what the proxy sends and records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from agentlightning.client import GatewayClient
from agentlightning.openai_server.app import OpenAIServer
from agentlightning.schemas import Model
from agentlightning.server.proxy.context import fit_max_tokens, max_model_len
from tests.conftest import RunningGateway, start_gateway
from tests.server.test_proxy_token_exact import KEY, Rollout

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "policy",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def upstream(listed: dict[str, Any], seen: list[dict[str, Any]]) -> OpenAIServer:
    """Lists `listed` on GET /v1/models; answers chat, noting each body in `seen`; no token endpoints."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response(listed)

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(COMPLETION)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return OpenAIServer(app)


@pytest.fixture
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path_factory.mktemp("context"), KEY)
    try:
        yield gw
    finally:
        gw.process.stop()


def _register(gw: RunningGateway, endpoint: str) -> None:
    with GatewayClient(gw.url, KEY) as c:
        c.register_models([Model(model="policy", endpoint=endpoint, version=1)])


def test_max_tokens_past_the_listed_context_is_lowered_to_it(gateway: RunningGateway) -> None:
    seen: list[dict[str, Any]] = []
    with upstream({"data": [{"id": "policy", "max_model_len": 1024}]}, seen) as server:
        _register(gateway, server.base_url)
        rollout = Rollout(gateway)
        hi = [{"role": "user", "content": "hi"}]
        rollout.openai.chat.completions.create(model="m", messages=hi, max_tokens=32000)  # type: ignore[arg-type]
        rollout.openai.chat.completions.create(model="m", messages=hi, max_completion_tokens=5000)  # type: ignore[arg-type]
        rollout.openai.chat.completions.create(model="m", messages=hi, max_tokens=64)  # type: ignore[arg-type]
        rollout.anthropic.messages.create(model="m", max_tokens=32000, messages=hi, timeout=60)  # type: ignore[arg-type]
    assert [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in seen] == [
        (1024, None),
        (None, 1024),
        (64, None),
        (1024, None),
    ]
    events = rollout.events()
    assert [e["http_status"] for e in events] == [200] * 4
    # The agent's request is recorded as sent.
    assert events[0]["request"]["max_tokens"] == 32000 and events[3]["request"]["max_tokens"] == 32000


def test_an_upstream_that_lists_no_context_gets_the_agents_value(gateway: RunningGateway) -> None:
    seen: list[dict[str, Any]] = []
    with upstream({"object": "list", "data": [{"id": "policy"}]}, seen) as server:
        _register(gateway, server.base_url)
        Rollout(gateway).openai.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=32000,
        )
    assert seen[0]["max_tokens"] == 32000


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ({"data": [{"id": "policy", "max_model_len": 640}, {"id": "other", "max_model_len": 8}]}, 640),
        ({"data": [{"id": "served-under-another-name", "max_model_len": 640}]}, 640),  # the only one
        ({"data": [{"id": "a", "max_model_len": 640}, {"id": "b", "max_model_len": 8}]}, None),
        ({"data": [{"id": "policy", "max_model_len": "640"}]}, None),
        ({"data": [{"id": "policy", "max_model_len": True}]}, None),
        ({"error": "no"}, None),
        (None, None),
        ([], None),
    ],
)
def test_max_model_len_is_read_from_the_listing(listed: Any, expected: int | None) -> None:
    assert max_model_len(listed, "policy") == expected


def test_fit_sets_only_what_asks_for_more() -> None:
    params: dict[str, Any] = {"model": "policy"}
    fit_max_tokens({"max_tokens": 10, "max_completion_tokens": 99}, params, 50)
    assert params == {"model": "policy", "max_completion_tokens": 50}
    params = {}
    fit_max_tokens({"max_tokens": 99}, params, None)
    assert params == {}
