"""Soak benchmark: does a Gateway that runs for days stay bounded in memory and on disk?

Throughout, one agent keeps recording small events and the trainer keeps polling, between rounds
too, as in a real run. Each round does what one training step does to the Gateway, at scale: create `--rollouts`
rollouts, run an agent for each (`--calls` proxied chat calls whose conversation grows, a
reward, running → succeeded), read their events as triplets in batches (the trainer
collecting), then delete every one of them. A real `agl-server` process serves; the fake
vLLM-shaped model server (tests/fakes/model_server.py) answers the model calls.

After each round it prints the Gateway's RSS, the database file, the WAL file (and its largest
size seen during the round). The last lines give the growth per 1,000 deleted rollouts after
the warm-up rounds (least-squares slope): ~0 means bounded.

`--baseline DIR` runs the same soak against the Gateway of another checkout first (e.g. the
code before a fix: `git archive main | tar -x -C /tmp/soak-before`), side by side in one run.

Usage: python bench/soak.py [--store sqlite memory] [--rounds 8] [--warmup 3] [--rollouts 1000]
                            [--calls 4] [--concurrency 32] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from agentlightning.launch import start_gateway
from agentlightning.procs import ManagedProcess, free_port

REPO = Path(__file__).resolve().parent.parent
KEY = "soak-key"
MB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys over 0, 1, 2, …"""
    n = len(ys)
    if n < 2:
        return float("nan")
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(ys))
    return num / sum((x - mean_x) ** 2 for x in range(n))


@dataclass
class Round:
    seconds: float
    rss: int
    db: int
    wal: int
    wal_peak: int


@dataclass
class Soak:
    label: str
    store: str
    rounds: list[Round] = field(default_factory=list)


class Gateway:
    def __init__(self, tmp: Path, store: str, code_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = tmp / f"gw-{self.port}.db"
        self.wal = Path(f"{self.db}-wal")
        self.store_url = "memory://" if store == "memory" else f"sqlite:///{self.db}"
        self.log = tmp / f"gw-{self.port}.log"
        self.env = dict(os.environ, PYTHONPATH=str(code_dir))  # that checkout's Gateway
        self.code_dir = code_dir

    def __enter__(self) -> Gateway:
        self.proc = start_gateway(
            port=self.port,
            key=KEY,
            store_url=self.store_url,
            log_level="warning",
            log_path=self.log,
            env=self.env,
            cwd=self.code_dir,
            ready_timeout=120,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()


async def check(resp: aiohttp.ClientResponse, what: str) -> Any:
    if resp.status >= 300:
        raise RuntimeError(f"{what}: {resp.status} {await resp.text()}")
    return await resp.json() if resp.content_type == "application/json" else None


async def agent(session: aiohttp.ClientSession, rollout_id: str, calls: int) -> None:
    async with session.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}}) as r:
        await check(r, "patch running")
    base = f"/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"question {rollout_id}: " + "word " * 200}]
    for turn in range(calls):
        async with session.post(base, json={"messages": messages, "max_tokens": 64}) as r:
            answer = await check(r, "proxy call")
        messages += [
            answer["choices"][0]["message"],
            {"role": "user", "content": f"tool output {turn} " * 30},
        ]
    event = {"event_type": "reward", "data": {"value": 1.0}}
    async with session.post(f"/api/rollouts/{rollout_id}/attempt/a1/events", json=event) as r:
        await check(r, "reward")
    async with session.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded"}}) as r:
        await check(r, "patch succeeded")


async def one_round(session: aiohttp.ClientSession, n: int, calls: int, concurrency: int) -> None:
    ids = [uuid.uuid4().hex for _ in range(n)]
    for start in range(0, n, 500):
        body = [{"rollout_id": i, "input": {"q": i}} for i in ids[start : start + 500]]
        async with session.post("/api/rollouts", json=body) as r:
            await check(r, "create")
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in ids:
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await agent(session, queue.get_nowait(), calls)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    for start in range(0, n, 100):  # the trainer collects
        query = {"rollout_ids": ids[start : start + 100], "format": "triplet"}
        async with session.post("/api/rollouts/batch/events", json=query) as r:
            await r.read()
    for start in range(0, n, 1000):  # and deletes what it used
        async with session.post(
            "/api/rollouts/batch/delete", json={"rollout_ids": ids[start : start + 1000]}
        ) as r:
            await check(r, "delete")


async def watch_wal(wal: Path, done: asyncio.Event, peak: list[int]) -> None:
    while not done.is_set():
        peak[0] = max(peak[0], file_size(wal))
        await asyncio.sleep(0.2)


async def steady_load(session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
    """What never pauses in a real run: an agent still recording and the trainer polling, also
    between rounds. Without such a pause, a checkpoint that only copies never catches up."""
    rollout_id = f"steady-{uuid.uuid4().hex}"
    async with session.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": {}}]) as r:
        await check(r, "create the steady rollout")
    event = {"event_type": "log", "data": {"line": "x" * 2000}}
    while not stop.is_set():
        async with session.post(f"/api/rollouts/{rollout_id}/attempt/a1/events", json=event) as r:
            await r.read()
        async with session.get("/api/rollouts/terminal", params={"after": 0, "limit": 10}) as r:
            await r.read()
        await asyncio.sleep(0.01)
    async with session.delete(f"/api/rollouts/{rollout_id}") as r:
        await r.read()


async def soak(gw: Gateway, fake_url: str, args: argparse.Namespace, result: Soak) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    connector = aiohttp.TCPConnector(limit=args.concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(gw.url, headers=headers, connector=connector, timeout=timeout) as s:
        async with s.post("/api/models", json=[{"model": "policy", "endpoint": fake_url, "version": 1}]) as r:
            await check(r, "register model")
        stop_steady = asyncio.Event()
        steady = asyncio.create_task(steady_load(s, stop_steady))
        for i in range(args.rounds):
            done = asyncio.Event()
            peak = [0]
            watcher = asyncio.create_task(watch_wal(gw.wal, done, peak))
            started = time.perf_counter()
            await one_round(s, args.rollouts, args.calls, args.concurrency)
            seconds = time.perf_counter() - started
            await asyncio.sleep(2)  # the checkpointer's next turn, before the files are measured
            done.set()
            await watcher
            rnd = Round(seconds, rss_bytes(gw.proc.pid), file_size(gw.db), file_size(gw.wal), peak[0])
            result.rounds.append(rnd)
            async with aiohttp.ClientSession(fake_url.removesuffix("/v1")) as fake:
                async with fake.post("/fake/reset") as r:  # the fake keeps its last requests
                    await r.read()
            print(
                f"  {result.label:8} {result.store:6} round {i + 1:2}: {seconds:6.1f} s  "
                f"RSS {rnd.rss / MB:6.1f} MB  db {rnd.db / MB:7.1f} MB  "
                f"WAL {rnd.wal / MB:7.1f} MB (peak {rnd.wal_peak / MB:7.1f} MB)",
                flush=True,
            )
        stop_steady.set()
        await steady


def summary(result: Soak, warmup: int, rollouts: int) -> str:
    after = result.rounds[warmup:]
    per_k = 1000 / rollouts
    rss = slope([r.rss for r in after]) * per_k / MB
    disk = slope([r.db + r.wal for r in after]) * per_k / MB
    last = result.rounds[-1]
    return (
        f"{result.label:8} {result.store:6}: growth per 1,000 deleted rollouts after {warmup} warm-up "
        f"round(s): RSS {rss:+.2f} MB, db+WAL {disk:+.2f} MB | last round: RSS {last.rss / MB:.0f} MB, "
        f"db {last.db / MB:.1f} MB, WAL {last.wal / MB:.1f} MB, WAL peak {max(r.wal_peak for r in result.rounds) / MB:.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", nargs="+", choices=["sqlite", "memory"], default=["sqlite", "memory"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="rounds left out of the growth figure")
    parser.add_argument("--rollouts", type=int, default=1000, help="per round")
    parser.add_argument("--calls", type=int, default=4, help="proxied model calls per rollout")
    parser.add_argument("--concurrency", type=int, default=32, help="agents at once")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to soak first")
    args = parser.parse_args()
    if args.rounds <= args.warmup + 1:
        parser.error("--rounds must exceed --warmup by at least 2 to measure a growth")

    runs = [("ours", REPO)]
    if args.baseline is not None:
        runs.insert(0, ("baseline", args.baseline.resolve()))
    results: list[Soak] = []
    with tempfile.TemporaryDirectory(prefix="agl-soak-") as tmp_dir:
        tmp = Path(tmp_dir)
        fake_port = free_port()
        fake = ManagedProcess(
            "fake-model",
            [sys.executable, "-m", "tests.fakes.model_server", "--port", str(fake_port)],
            tmp / "fake.log",
            cwd=REPO,
        ).start()
        try:
            fake.wait_http_ok(f"http://127.0.0.1:{fake_port}/v1/models", timeout=60)
            for store in args.store:
                for label, code_dir in runs:
                    result = Soak(label, store)
                    with Gateway(tmp, store, code_dir) as gw:
                        asyncio.run(soak(gw, f"http://127.0.0.1:{fake_port}/v1", args, result))
                    results.append(result)
        finally:
            fake.stop()
    print()
    for result in results:
        print(summary(result, args.warmup, args.rollouts))


if __name__ == "__main__":
    main()
