"""Benchmark the Gateway on Postgres: SQLite vs Postgres, one vs two replicas, side by side in one run.

One run starts its own Postgres (tests/local_postgres.py: initdb in a temporary folder, fsync
on, as a real deployment), the fake vLLM-shaped model server, and for each setup the Gateway
processes, then measures

* proxied calls/s: N agents calling through the Gateway (bench/proxy.py's load generator), with
  the CPU time per call of the Gateway(s) and of Postgres;
* store operations/s: the Store interface in-process (create, append, read, patch), SQLite vs
  Postgres, and Postgres with two processes at once (two replicas' worth);
* the capacity figure: agents one replica and one Postgres serve at the measured CPU per call,
  for agents that make one model call every `--agent-interval` seconds;
* with `--batch N`: the failure run — N rollouts over two replicas while one is SIGKILLed twice
  and restarted (tests/server/replica_batch.py): lost rollouts, missing events, retries.

    .venv/bin/python bench/replicas.py                        # all but the failure run
    .venv/bin/python bench/replicas.py --batch 300            # also the 300-rollout failure run
    .venv/bin/python bench/replicas.py --agents 32 --duration 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentlightning import launch  # noqa: E402
from agentlightning.procs import free_port  # noqa: E402
from agentlightning.schemas import Rollout, RolloutState, RolloutStatusPatch  # noqa: E402
from agentlightning.server.events import make_record  # noqa: E402
from agentlightning.server.store import store_from_url  # noqa: E402
from bench.proxy import KEY, Gateway, cpu_seconds, prepare, run_load, start_model  # noqa: E402
from tests.local_postgres import LocalPostgres  # noqa: E402


def postgres_cpu(pg: LocalPostgres) -> float:
    """CPU seconds of the postmaster and all its backends so far (Linux)."""
    import psutil

    assert pg.proc is not None
    try:
        root = psutil.Process(pg.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# --- proxied calls/s ------------------------------------------------------------------------


def start_replica(label: str, store_url: str, tmp: Path) -> Gateway:
    port = free_port()
    proc = launch.start_gateway(
        port=port,
        key=KEY,
        store_url=store_url,
        log_level="warning",
        log_path=tmp / f"gateway-{port}.log",
        cwd=ROOT,
        name=f"gateway {label}",
        ready_timeout=180,  # a loaded machine starts Python slowly
    )
    return Gateway(label, proc.url, proc)


def proxied(
    label: str,
    store_url: str,
    replicas: int,
    model_url: str,
    args: argparse.Namespace,
    pg: LocalPostgres,
    tmp: Path,
) -> dict[str, Any]:
    gateways = [start_replica(f"{label}-{i}", store_url, tmp) for i in range(replicas)]
    try:
        tag = f"{label.replace(' ', '')}-{time.monotonic_ns()}"
        urls, keys = prepare(gateways[0], model_url, args.agents, tag)
        # Agents spread over the replicas, as a load balancer would.
        urls = [u.replace(gateways[0].url, gateways[i % replicas].url) for i, u in enumerate(urls)]
        before = [cpu_seconds(g.process.pid) for g in gateways], postgres_cpu(pg)
        result = run_load(urls, args.duration, args.warmup, keys)
        calls = max(result["total"], 1)
        gw_ms = (
            sum(cpu_seconds(g.process.pid) - b for g, b in zip(gateways, before[0], strict=True))
            * 1000
            / calls
        )
        pg_ms = (postgres_cpu(pg) - before[1]) * 1000 / calls if store_url.startswith("postgresql") else 0.0
        return {
            "setup": label,
            "calls_per_s": result["rps"],
            "p50_ms": result["p50_ms"],
            "p99_ms": result["p99_ms"],
            "errors": result["errors"],
            "gateway_cpu_ms": gw_ms,
            "postgres_cpu_ms": pg_ms,
        }
    finally:
        for g in gateways:
            g.process.stop()


# --- store operations/s ---------------------------------------------------------------------


async def store_ops(url: str, n: int, concurrency: int, tag: str) -> dict[str, float]:
    store = store_from_url(url)
    await store.open()
    rates: dict[str, float] = {}
    try:
        ids = [f"{tag}-{i}" for i in range(n)]
        sem = asyncio.Semaphore(concurrency)

        async def timed(name: str, make: Any) -> None:
            async def one(i: int) -> None:
                async with sem:
                    await make(i)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(n)))
            rates[name] = n / (time.perf_counter() - t0)

        await timed("create", lambda i: store.create_rollouts([Rollout(rollout_id=ids[i], input={"i": i})]))
        data = {"value": 1.0, "note": "x" * 200}
        await timed(
            "append",
            lambda i: store.append_event(make_record(ids[i % n], "a1", "reward", data, time.time())),
        )
        await timed("get", lambda i: store.get_rollout(ids[i]))
        await timed("events", lambda i: store.list_events(ids[i]))
        await timed(
            "patch",
            lambda i: store.patch_rollout(ids[i], RolloutStatusPatch(state=RolloutState.RUNNING), 1.0),
        )
    finally:
        await store.close()
    return rates


def store_ops_worker() -> None:
    spec = json.loads(sys.argv[-1])
    print(json.dumps(asyncio.run(store_ops(spec["url"], spec["n"], spec["concurrency"], spec["tag"]))))


def store_ops_processes(url: str, processes: int, n: int, concurrency: int) -> dict[str, float]:
    """The same workload in `processes` processes at once; their rates added up."""
    procs = []
    for i in range(processes):
        spec = json.dumps(
            {"url": url, "n": n, "concurrency": concurrency, "tag": f"p{i}-{time.monotonic_ns()}"}
        )
        p = subprocess.Popen(
            [sys.executable, __file__, "--store-worker", spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        procs.append(p)
    total: dict[str, float] = {}
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"store worker failed:\n{err[-2000:]}")
        for k, v in json.loads(out.strip().splitlines()[-1]).items():
            total[k] = total.get(k, 0.0) + v
    return total


# --- the failure run --------------------------------------------------------------------------


def failure_run(pg: LocalPostgres, model_url: str, n: int, tmp: Path) -> dict[str, Any]:
    from tests.server.replica_batch import Replica, check_nothing_lost, run_batch

    url = pg.create_database(f"batch{time.monotonic_ns()}")
    tail = [f"key={KEY}", f"store.url={url}", "log_level=warning"]
    replicas = [Replica(free_port(), tail, tmp).start() for _ in range(2)]
    try:
        import httpx

        httpx.post(
            f"{replicas[0].url}/api/models",
            json=[{"model": "policy", "endpoint": f"{model_url}/v1"}],
            headers={"x-api-key": KEY},
        ).raise_for_status()
        killed_at: list[int] = []

        def chaos(done: Any) -> None:
            for fraction in (0.3, 0.6):
                while done() < n * fraction:
                    time.sleep(0.05)
                killed_at.append(done())
                replicas[1].kill()
                replicas[1].start()

        t0 = time.perf_counter()
        outcome, rids = run_batch([r.url for r in replicas], KEY, n, 32, chaos, timeout=1800)
        seconds = time.perf_counter() - t0
        counts = check_nothing_lost([r.url for r in replicas], KEY, outcome, rids)
        bare = [s for s, retry_after in outcome.failures if not retry_after]
        return {
            "rollouts": n,
            "finished": len(outcome.finished),
            "lost": n - len(outcome.finished),
            "acknowledged_events": sum(len(v) for v in outcome.acknowledged.values()),
            "missing_events": 0,  # check_nothing_lost asserts there are none
            "kills_at_finished": killed_at,
            "retries": outcome.retries,
            "answers_without_retry_after": len(bare),
            "duplicate_records": counts["duplicates"],
            "seconds": seconds,
        }
    finally:
        for r in replicas:
            r.stop()


# --- the report -----------------------------------------------------------------------------


def throughput(args: argparse.Namespace, pg: LocalPostgres, model_url: str, tmp: Path) -> None:
    rows = [
        proxied("sqlite x1", f"sqlite:///{tmp}/gw.db", 1, model_url, args, pg, tmp),
        proxied("postgres x1", pg.create_database("proxy1"), 1, model_url, args, pg, tmp),
    ]
    if not args.smoke:  # the smoke run: one replica on each store
        rows.append(proxied("postgres x2", pg.create_database("proxy2"), 2, model_url, args, pg, tmp))
    print("\n## proxied calls/s (every call recorded)")
    print(
        f"{'setup':<13}{'calls/s':>9}{'ratio':>7}{'p50 ms':>8}{'p99 ms':>8}{'gw cpu ms':>10}{'pg cpu ms':>10}  errors"
    )
    base = rows[0]["calls_per_s"]
    for r in rows:
        print(
            f"{r['setup']:<13}{r['calls_per_s']:>9.0f}{r['calls_per_s'] / base:>7.2f}{r['p50_ms']:>8.1f}"
            f"{r['p99_ms']:>8.1f}{r['gateway_cpu_ms']:>10.2f}{r['postgres_cpu_ms']:>10.2f}  {r['errors'] or ''}"
        )
    ops = {
        "sqlite x1": store_ops_processes(f"sqlite:///{tmp}/ops.db", 1, args.store_n, 64),
        "postgres x1": store_ops_processes(pg.create_database("ops1"), 1, args.store_n, 64),
    }
    if not args.smoke:
        ops["postgres x2"] = store_ops_processes(pg.create_database("ops2"), 2, args.store_n, 64)
    print("\n## store operations/s (in-process Store API, 64 concurrent; x2: two processes, summed)")
    names = list(ops["sqlite x1"])
    print(f"{'setup':<13}" + "".join(f"{n:>10}" for n in names))
    for label, rates in ops.items():
        print(f"{label:<13}" + "".join(f"{rates[n]:>10.0f}" for n in names))
    pg_row = rows[1]
    per_call = pg_row["gateway_cpu_ms"] + 0.0
    print("\n## capacity at the measured CPU per call")
    agents_replica = 1000 / per_call * args.agent_interval if per_call else float("nan")
    agents_pg = (
        1000 / pg_row["postgres_cpu_ms"] * args.agent_interval if pg_row["postgres_cpu_ms"] else float("nan")
    )
    print(
        f"one replica (one core: the Gateway is one process): {1000 / per_call:.0f} calls/s at "
        f"{per_call:.2f} ms CPU per call -> {agents_replica:.0f} agents making a call every "
        f"{args.agent_interval:.0f} s"
    )
    print(
        f"one Postgres core: {1000 / pg_row['postgres_cpu_ms']:.0f} calls/s at {pg_row['postgres_cpu_ms']:.2f} ms "
        f"CPU per call -> {agents_pg:.0f} such agents per core it is given"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=64, help="concurrent agents (calls in flight)")
    parser.add_argument("--delay", type=float, default=0.05, help="the fake model's answer delay, seconds")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--store-n", type=int, default=2000, help="operations of each kind, store level")
    parser.add_argument(
        "--agent-interval", type=float, default=10.0, help="seconds between one agent's calls"
    )
    parser.add_argument("--batch", type=int, default=0, help="also the failure run with this many rollouts")
    parser.add_argument("--no-throughput", action="store_true", help="only the failure run (--batch)")
    parser.add_argument("--store-worker", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny sizes: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.agents, args.duration, args.warmup, args.store_n = 4, 0.5, 0.3, 50
    if args.store_worker:
        store_ops_worker()
        return
    tmp = Path(tempfile.mkdtemp(prefix="agl-bench-replicas-"))
    pg = LocalPostgres(fsync=True).start()
    model_url, model = start_model(args.delay, tmp)
    try:
        print(
            f"# {os.cpu_count()} CPUs; Postgres {pg.bin_dir}; {args.agents} agents, model delay {args.delay} s"
        )
        if not args.no_throughput:
            throughput(args, pg, model_url, tmp)
        if args.batch:
            print(f"\n## failure run: {args.batch} rollouts over two replicas, replica 2 SIGKILLed twice")
            print(json.dumps(failure_run(pg, model_url, args.batch, tmp), indent=1))
    finally:
        model.stop()
        pg.destroy()


if __name__ == "__main__":
    main()
