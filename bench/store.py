"""Event store benchmark: SQLite (durable, the default) against in-memory, in one run.

Events are shaped like real `model_request` records (2-20 KB of JSON, mostly token ids and
log-probs). Figures per store, from many concurrent writers:

* store only: `store.append_event` of ready records. In memory that is a list append, so
  this ratio only shows what durability costs in absolute terms;
* capture path: encode the event (JSON, triplet view) and append it, which is what the proxy
  does for every model call;
* HTTP: POST .../events against a real `agl-server` process, load from a separate process
  (aiohttp: httpx's client, not the server, is the bottleneck at this rate);
* per-rollout query latency (p50/p99): one rollout's events, raw and as triplets, among
  thousands of rollouts.

Usage: python bench/store.py [--events 20000] [--rollouts 2000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentlightning.launch import start_gateway
from agentlightning.procs import free_port
from agentlightning.schemas import Rollout
from agentlightning.server.events import make_record, render_events
from agentlightning.server.store import MemoryStore, SqliteStore, Store


def model_call(rng: random.Random) -> dict[str, Any]:
    """A model_request payload of ~2-20 KB: prompt/response ids and per-token log-probs."""
    n_prompt = rng.randint(100, 1200)
    n_resp = rng.randint(20, 300)
    prompt = [rng.randrange(150_000) for _ in range(n_prompt)]
    resp = [rng.randrange(150_000) for _ in range(n_resp)]
    return {
        "api": "chat.completions",
        "request": {"messages": [{"role": "user", "content": "q" * rng.randint(50, 400)}]},
        "params": {"model": "policy", "temperature": 1.0},
        "response": {
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "a" * n_resp},
                    "token_ids": resp,
                    "logprobs": {"content": [{"logprob": -rng.random()} for _ in resp]},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_resp},
        },
        "server": {"model": "policy", "endpoint": "http://127.0.0.1:8000/v1", "version": 1},
        "latency_ms": 50.0,
        "http_status": 200,
        "status": "ok",
    }


def payloads(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    pool = [model_call(rng) for _ in range(min(n, 500))]  # reuse shapes: generation is not what we time
    return [pool[i % len(pool)] for i in range(n)]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def store_level(
    store: Store, events: list[dict[str, Any]], n_rollouts: int, concurrency: int
) -> dict[str, float]:
    await store.open()
    try:
        await store.create_rollouts([Rollout(rollout_id=f"r{i}") for i in range(n_rollouts)])
        half = len(events) // 2
        records = [
            make_record(f"r{i % n_rollouts}", "a", "model_request", e, 0.0)
            for i, e in enumerate(events[:half])
        ]
        ready = iter(records)

        async def append_ready() -> None:
            for record in ready:
                await store.append_event(record)

        start = time.perf_counter()
        await asyncio.gather(*(append_ready() for _ in range(concurrency)))
        append_s = time.perf_counter() - start

        raw = iter(enumerate(events[half:], start=half))

        async def capture() -> None:
            for i, event in raw:
                await store.append_event(make_record(f"r{i % n_rollouts}", "a", "model_request", event, 0.0))

        start = time.perf_counter()
        await asyncio.gather(*(capture() for _ in range(concurrency)))
        capture_s = time.perf_counter() - start

        raw_lat, trip_lat = [], []
        for i in random.Random(1).sample(range(n_rollouts), min(300, n_rollouts)):
            t0 = time.perf_counter()
            render_events(await store.list_events(f"r{i}", "a"))
            t1 = time.perf_counter()
            render_events(await store.list_events(f"r{i}", "a", view="triplet"), "triplet")
            t2 = time.perf_counter()
            raw_lat.append(t1 - t0)
            trip_lat.append(t2 - t1)
        return {
            "append_per_s": len(records) / append_s,
            "capture_per_s": (len(events) - half) / capture_s,
            "raw_p50_ms": pct(raw_lat, 0.5) * 1e3,
            "raw_p99_ms": pct(raw_lat, 0.99) * 1e3,
            "triplet_p50_ms": pct(trip_lat, 0.5) * 1e3,
            "triplet_p99_ms": pct(trip_lat, 0.99) * 1e3,
        }
    finally:
        await store.close()


def _http_load(url: str, n_events: int, n_rollouts: int, concurrency: int, out: Any) -> None:
    """Runs in its own process, so the load generator does not share the Gateway's core."""
    import aiohttp
    import orjson

    bodies = [orjson.dumps({"event_type": "model_request", "data": e}) for e in payloads(n_events, seed=2)]
    headers = {"content-type": "application/json"}

    async def run() -> float:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(url, connector=connector) as c:
            async with c.post(
                "/api/rollouts", json=[{"rollout_id": f"r{i}"} for i in range(n_rollouts)]
            ) as r:
                r.raise_for_status()
            it = iter(enumerate(bodies))

            async def worker() -> None:
                for i, body in it:
                    async with c.post(
                        f"/api/rollouts/r{i % n_rollouts}/attempt/a/events", data=body, headers=headers
                    ) as r:
                        await r.read()
                        r.raise_for_status()

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return time.perf_counter() - start

    out.put(n_events / asyncio.run(run()))


def http_level(store_url: str, tmp: Path, n_events: int, n_rollouts: int, concurrency: int) -> float:
    port = free_port()
    with start_gateway(
        port=port, log_level="warning", store_url=store_url, log_path=tmp / f"gw-{port}.log"
    ) as gw:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        loader = ctx.Process(target=_http_load, args=(gw.url, n_events, n_rollouts, concurrency, out))
        loader.start()
        rate: float = out.get(timeout=600)
        loader.join()
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--http-events", type=int, default=8_000)
    parser.add_argument("--rollouts", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny sizes: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.events, args.http_events, args.rollouts, args.concurrency = 400, 200, 40, 8

    events = payloads(args.events)
    sizes = [len(make_record("r", "a", "model_request", e, 0.0).data) for e in events[:500]]
    print(
        f"events: {args.events} over {args.rollouts} rollouts, payload {min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KB "
        f"(mean {statistics.mean(sizes) / 1024:.1f} KB), {args.concurrency} concurrent writers"
    )
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        mem = asyncio.run(store_level(MemoryStore(), events, args.rollouts, args.concurrency))
        sql = asyncio.run(store_level(SqliteStore(tmp / "bench.db"), events, args.rollouts, args.concurrency))
        print("\nin process (store API, event encoding, rendering)")
        print(f"{'':28}{'memory':>12}{'sqlite':>12}{'sqlite/memory':>16}")
        for key, label in [
            ("append_per_s", "store-only appends/s"),
            ("capture_per_s", "capture-path appends/s"),
            ("raw_p50_ms", "query raw p50 ms"),
            ("raw_p99_ms", "query raw p99 ms"),
            ("triplet_p50_ms", "query triplet p50 ms"),
            ("triplet_p99_ms", "query triplet p99 ms"),
        ]:
            print(f"{label:28}{mem[key]:12.2f}{sql[key]:12.2f}{sql[key] / mem[key]:16.2f}")

        http_mem = http_level("memory://", tmp, args.http_events, args.rollouts, args.concurrency)
        http_sql = http_level(
            f"sqlite:///{tmp / 'http.db'}", tmp, args.http_events, args.rollouts, args.concurrency
        )
        print("\nthrough a real agl-server (POST events, load from a separate process)")
        print(f"{'appends/s':28}{http_mem:12.0f}{http_sql:12.0f}{http_sql / http_mem:16.2f}")
        capture = sql["capture_per_s"] / mem["capture_per_s"]
        print(
            f"\nSQLite/in-memory append throughput: capture path {capture:.2f}x, through the Gateway "
            f"{http_sql / http_mem:.2f}x (target >= 0.5x); store call alone "
            f"{sql['append_per_s'] / mem['append_per_s']:.2f}x ({sql['append_per_s']:.0f} durable appends/s)"
        )


if __name__ == "__main__":
    main()
