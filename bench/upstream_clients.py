"""Which HTTP client should carry the proxy's upstream calls? httpx, httpx2, aiohttp side by side.

Each client, in its own process, keeps N calls in flight against the fake model server for a
fixed time, with an unlimited connection pool (the proxy's pool must not cap concurrency).
Printed: calls/s, the client's CPU time per call, and p50/p99 latency.

    .venv/bin/python bench/upstream_clients.py --scenarios 256:0.05,1024:1.0 --duration 8
    .venv/bin/python bench/upstream_clients.py --smoke   # 8 in flight for 1 s: that it runs

httpx2 is not a dependency: a client that does not import is said so and left out
(`.venv/bin/pip install httpx2` to measure it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentlightning.procs import ManagedProcess, free_port  # noqa: E402

CLIENTS = ("httpx", "httpx2", "aiohttp")  # httpx2: the httpx fork the OpenAI SDK now uses
BODY = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hello there"}]}).encode()


async def _run(client: str, url: str, n: int, duration: float, warmup: float) -> dict[str, Any]:
    latencies: list[float] = []
    start = time.perf_counter()
    window = (start + warmup, start + warmup + duration)
    total = 0
    errors = 0

    async def loop(post: Any) -> None:
        nonlocal total, errors
        while time.perf_counter() < window[1]:
            t0 = time.perf_counter()
            ok = await post()
            t1 = time.perf_counter()
            total += 1
            errors += not ok
            if ok and window[0] <= t1 <= window[1]:
                latencies.append(t1 - t0)

    if client in ("httpx", "httpx2"):
        import importlib

        httpx = importlib.import_module(client)

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=600) as session:

            async def post() -> bool:
                r = await session.post(url, content=BODY, headers={"Content-Type": "application/json"})
                return r.status_code == 200

            await asyncio.gather(*(loop(post) for _ in range(n)))
    else:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:

            async def post() -> bool:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status == 200

            await asyncio.gather(*(loop(post) for _ in range(n)))
    latencies.sort()
    pick = lambda q: latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1000 if latencies else 0.0  # noqa: E731
    return {
        "rps": len(latencies) / duration,
        "cpu_ms_per_call": time.process_time() * 1000 / max(total, 1),
        "p50_ms": pick(0.5),
        "p99_ms": pick(0.99),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--scenarios", default="256:0.05,1024:1.0", help="CALLS_IN_FLIGHT:MODEL_DELAY,...")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs end to end")
    args = parser.parse_args()
    if args.smoke:
        args.scenarios, args.duration, args.warmup = "8:0.01", 1.0, 0.3
    if args.worker:
        client, url, n, duration, warmup = args.worker
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        print(json.dumps(asyncio.run(_run(client, url, int(n), float(duration), float(warmup)))))
        return
    print(
        f"{'in flight':>9} {'model':>6} {'client':>8} {'calls/s':>8} {'cpu ms/call':>11} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
    )
    clients = [c for c in CLIENTS if importlib.util.find_spec(c) is not None]
    for missing in sorted(set(CLIENTS) - set(clients)):
        print(f"{missing}: not installed, left out (pip install {missing})")
    for item in args.scenarios.split(","):
        n, delay = item.split(":")
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tests.fakes.model_server",
            "--port",
            str(port),
            "--delay",
            delay,
        ]
        model = ManagedProcess("fake-model", argv, Path("/tmp") / f"agl-fake-{port}.log", cwd=ROOT).start()
        try:
            model.wait_http_ok(f"http://127.0.0.1:{port}/health")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            for client in clients:
                cmd = [
                    sys.executable,
                    __file__,
                    "--worker",
                    client,
                    url,
                    n,
                    str(args.duration),
                    str(args.warmup),
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"{n:>9} {float(delay) * 1000:>4.0f}ms {client:>8} {r['rps']:>8.0f} {r['cpu_ms_per_call']:>11.2f} "
                    f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['errors']:>6}",
                    flush=True,
                )
        finally:
            model.stop()


if __name__ == "__main__":
    main()
