"""Publishing weights: the version bumps, no request fails, every answer comes from one version."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentlightning.tiny_model import build_model
from agentlightning.torch_backend.engine import SamplingParams, TorchEngine
from agentlightning.torch_backend.openai_backend import VERSION_HEADER, InferenceServer

from .tiny import TINY, fresh_copy

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy
MAX_TOKENS = 40


def greedy(model: Any, tokenizer: Any, prompts: list[list[int]]) -> list[list[int]]:
    engine = TorchEngine(model, tokenizer)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        return [r.token_ids for r in engine.generate(prompts, params)]
    finally:
        engine.close()


async def until(condition: Callable[[], bool]) -> None:
    """Poll state that another thread owns (the engine's), for at most 30 s."""
    for _ in range(30_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached in time")


async def ask(http: httpx.AsyncClient, prompt: list[int], stream: bool) -> tuple[int, int, list[int]]:
    body = {
        "model": "policy",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if not stream:
        r = await http.post("/completions", json=body)
        return r.status_code, int(r.headers[VERSION_HEADER]), r.json()["choices"][0]["token_ids"]
    ids: list[int] = []
    async with http.stream("POST", "/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                ids += httpx.Response(200, content=line[6:]).json()["choices"][0]["token_ids"]
        return r.status_code, int(r.headers[VERSION_HEADER]), ids


async def test_publish_bumps_the_version_and_no_request_fails(tiny_model: Any, tokenizer: Any) -> None:
    old_model = fresh_copy(tiny_model, tokenizer)
    new_model = build_model(TINY, seed=7, tokenizer=tokenizer)
    prompts = [tokenizer.encode(f"request {i}", add_special_tokens=False) for i in range(12)]
    expected = {
        0: greedy(fresh_copy(old_model, tokenizer), tokenizer, prompts),
        1: greedy(new_model, tokenizer, prompts),
    }
    assert expected[0] != expected[1]

    engine = TorchEngine(old_model, tokenizer)
    server = InferenceServer(engine, "policy").start()
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60, trust_env=False) as http:
            first_wave = [
                asyncio.create_task(ask(http, p, stream=i % 2 == 0)) for i, p in enumerate(prompts[:6])
            ]
            await until(lambda: engine.stats.admitted >= 6)  # the whole first wave is generating
            publish = asyncio.create_task(asyncio.to_thread(server.publish, new_model.state_dict()))
            await until(lambda: engine.swap_pending or engine.version == 1)
            # Requests sent while the swap waits for the first wave: queued, not refused.
            second_wave = [
                asyncio.create_task(ask(http, p, stream=i % 2 == 0))
                for i, p in enumerate(prompts[6:], start=6)
            ]
            answers = await asyncio.gather(*first_wave, *second_wave)
            assert await publish == 1
            models = (await http.get("/models")).json()["data"][0]
    finally:
        server.stop()
        engine.close()
    assert server.version == 1 and models["version"] == 1
    for i, (status, version, ids) in enumerate(answers):
        assert status == 200
        assert version == (0 if i < 6 else 1), (i, version)
        # Every answer is exactly what one version alone would have generated: never a mix.
        assert ids == expected[version][i]


def test_publish_from_a_module_and_explicit_versions(tiny_model: Any, tokenizer: Any) -> None:
    engine = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer, version=3)
    try:
        assert engine.version == 3
        assert engine.publish(build_model(TINY, seed=8, tokenizer=tokenizer)) == 4
        assert engine.publish(tiny_model.state_dict(), version=10) == 10
        with pytest.raises(Exception, match="swap failed"):
            engine.publish({"nope": tiny_model.lm_head.weight})
        assert engine.version == 10  # a failed swap changes nothing
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        assert engine.generate([[1, 2, 3]], params)[0].version == 10
    finally:
        engine.close()
