"""Benchmark the model proxy: N concurrent agents through the Gateway vs straight to the model.

One run starts the fake vLLM-shaped model server (`tests.fakes.model_server`, answering
after a fixed delay), one `agl-server` per gateway command (SQLite store: every call is
persisted), and a load generator in its own process (`--pin`: the gateway gets CPU 0 to
itself, the load generator and model server the others). For each scenario (calls in flight, model
delay) it runs the agents straight against the model and through each gateway, `--repeat`
times interleaved (machine load changes), and prints the median run's throughput, the
throughput ratio and the latency the gateway adds (p50/p99) and the CPU time per call of every
process (the median over the runs), each of our gateway's paths checked against the targets of
the proxy issues (issue 41: 16, 64 and 256 in flight; issue 20: 1024 slow calls).

    .venv/bin/python bench/proxy.py                          # the issues' four scenarios
    .venv/bin/python bench/proxy.py --scenarios 64:0.05 --duration 5
    .venv/bin/python bench/proxy.py --agent-tokens          # also: agents holding their own tokens
    .venv/bin/python bench/proxy.py --gateway-cmd '/other/venv/bin/agl-server proxy.max_connections=100'
    .venv/bin/python bench/proxy.py --metrics-off     # also a gateway with metrics.enabled=false: the cost of /metrics
    .venv/bin/python bench/proxy.py --token-exact --scenarios 64:0.05   # pass-through vs tokens in/out vs direct
    .venv/bin/python bench/proxy.py --token-exact --turns 4   # agents of 4-call conversations

A gateway command gets `port=… key=… log_level=warning` appended, and `store.url=` a fresh
SQLite file unless it sets one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentlightning import launch  # noqa: E402
from agentlightning.client import GatewayClient  # noqa: E402
from agentlightning.procs import ManagedProcess, free_port  # noqa: E402
from agentlightning.schemas import Model, RolloutCreate  # noqa: E402

KEY = "bench-key"
MESSAGES = [
    {"role": "system", "content": "You are a careful assistant. Answer briefly and show your work."},
    {
        "role": "user",
        "content": "A train leaves at 3pm at 60 km/h; another at 4pm at 90 km/h. When does it catch up?",
    },
]
NEXT_QUESTION = {"role": "user", "content": "And if the second train left at 5pm?"}


@dataclass(frozen=True)
class Target:
    """What a path of our gateway must show in a scenario (None: not asked)."""

    ratio: float | None = None  # min throughput, direct = 1
    added_p50_ms: float | None = None  # max latency the gateway adds, median
    cpu_ms: float | None = None  # max gateway CPU time per call, median of the runs
    no_errors: bool = False

    def check(self, ratio: float, added50: float, cpu_ms: float, errors: int) -> tuple[bool, str]:
        """Whether a path's figures meet the target, and the target in words."""
        asked = []
        if self.ratio is not None:
            asked.append((ratio >= self.ratio, f"ratio>={self.ratio:g}"))
        if self.added_p50_ms is not None:
            asked.append((added50 <= self.added_p50_ms, f"+p50<={self.added_p50_ms:g}"))
        if self.cpu_ms is not None:
            asked.append((cpu_ms <= self.cpu_ms, f"cpu<={self.cpu_ms:g}"))
        if self.no_errors:
            asked.append((errors == 0, "0 err"))
        return all(ok for ok, _ in asked), ", ".join(words for _, words in asked)


# (calls in flight, model delay in seconds) -> what pass-through and the token path must show
PASS_THROUGH_TARGETS = {
    (16, 0.05): Target(cpu_ms=0.4),
    (64, 0.05): Target(ratio=0.95, added_p50_ms=3, cpu_ms=0.4),
    (256, 0.05): Target(ratio=0.8, cpu_ms=0.4),
    (1024, 1.0): Target(ratio=0.9, no_errors=True),
}
TOKEN_PATH_TARGETS = {
    (16, 0.05): Target(cpu_ms=0.6),
    (64, 0.05): Target(added_p50_ms=5, cpu_ms=0.6),
    (256, 0.05): Target(cpu_ms=0.6),
    (1024, 1.0): Target(ratio=0.9, no_errors=True),
}


def targets_of(label: str) -> dict[tuple[int, float], Target]:
    """Our gateway's paths are checked: `exact` on the token path, `ours` and `no-metrics` on
    pass-through (the fake model serves no token endpoints without --token-exact); other
    commands (a baseline) are shown, not checked."""
    path = label.removesuffix("+tok")
    if path == "exact":
        return TOKEN_PATH_TARGETS
    return PASS_THROUGH_TARGETS if path in ("ours", "no-metrics") else {}


# --- the load generator (runs in its own process) ----------------------------------------------


async def _load(
    urls: list[str], keys: list[str], duration: float, warmup: float, turns: int
) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors: dict[str, int] = {}
    start = time.perf_counter()
    window_start, window_end = start + warmup, start + warmup + duration
    completed = total = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def agent(url: str, key: str, start_after: float) -> None:
            nonlocal completed, total
            await asyncio.sleep(start_after)
            messages = list(MESSAGES)
            while time.perf_counter() < window_end:
                body = json.dumps({"model": "policy", "messages": messages, "max_tokens": 32}).encode()
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers={"x-api-key": key}) as r:
                        answer = await r.read()
                        ok = r.status == 200
                        kind = f"HTTP {r.status}"
                except Exception as exc:  # counted, never fatal: the benchmark reports errors
                    ok, kind = False, type(exc).__name__
                # A multi-turn agent: the answer and a next question go on the conversation,
                # `turns` calls long, then it starts over (in the same attempt).
                if ok and len(messages) < len(MESSAGES) + 2 * (turns - 1):
                    said = json.loads(answer)["choices"][0]["message"]
                    messages += [{"role": "assistant", "content": said.get("content")}, NEXT_QUESTION]
                else:
                    messages = list(MESSAGES)
                t1 = time.perf_counter()
                total += 1
                if window_start <= t1 <= window_end:
                    if ok:
                        completed += 1
                        latencies.append(t1 - t0)
                    else:
                        errors[kind] = errors.get(kind, 0) + 1

        # Agents start spread over the first half of the warm-up, as a population of agents
        # would, not all in the same millisecond: with a fixed model delay, a synchronized
        # start would go on as waves of N calls at once, a burst test rather than steady state.
        spread = warmup / 2
        await asyncio.gather(
            *(agent(u, k, spread * i / len(urls)) for i, (u, k) in enumerate(zip(urls, keys, strict=True)))
        )
    latencies.sort()
    return {
        "completed": completed,
        "total": total,
        "seconds": duration,
        "latencies": latencies,
        "errors": errors,
        "cpu_ms_per_call": time.process_time() * 1000 / max(total, 1),
    }


def worker(args: argparse.Namespace) -> None:
    spec = json.loads(sys.stdin.read())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    keys = spec.get("keys") or [KEY] * len(spec["urls"])
    result = asyncio.run(_load(spec["urls"], keys, spec["duration"], spec["warmup"], spec["turns"]))
    lat = result.pop("latencies")
    result["p50_ms"] = _pct(lat, 0.50) * 1000
    result["p99_ms"] = _pct(lat, 0.99) * 1000
    result["mean_ms"] = statistics.fmean(lat) * 1000 if lat else float("nan")
    print(json.dumps(result))


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)]


def run_load(
    urls: list[str], duration: float, warmup: float, keys: list[str] | None = None, turns: int = 1
) -> dict[str, Any]:
    spec = json.dumps({"urls": urls, "keys": keys, "duration": duration, "warmup": warmup, "turns": turns})
    out = subprocess.run(
        pinned([sys.executable, __file__, "--worker"], "others"),
        input=spec,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["rps"] = result["completed"] / result["seconds"]
    return result


# --- the processes under test ---------------------------------------------------------------

# CPU placement. `--pin` gives the gateway CPU 0 to itself and the agents (load generator)
# and the model server the others, in the direct runs too, as if each were on its own
# machine. The default lets the OS place everything: on a machine shared with other work a
# pinned gateway cannot move off a core that something else keeps busy.
PLACEMENT: dict[str, set[int] | None] = {"gateway": None, "others": None}


def pinned(argv: list[str], role: str) -> list[str]:
    cpus = PLACEMENT[role]
    if cpus is None:
        return argv
    pin = f"import os, sys; os.sched_setaffinity(0, {sorted(cpus)!r}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", pin, *argv]


@dataclass
class Gateway:
    label: str
    url: str
    process: ManagedProcess


def start_model(delay: float, workdir: Path, scale_out: bool = False) -> tuple[str, ManagedProcess]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.fakes.model_server",
        "--port",
        str(port),
        "--delay",
        str(delay),
    ]
    if scale_out:  # render / generate on tokens / derender, as `vllm serve --enable-scale-out`
        argv.append("--scale-out")
    proc = ManagedProcess(
        "fake-model", pinned(argv, "others"), workdir / f"model-{port}.log", cwd=ROOT
    ).start()
    url = f"http://127.0.0.1:{port}"
    proc.wait_http_ok(f"{url}/health", timeout=120)
    return url, proc


def start_gateway(label: str, command: list[str], workdir: Path) -> Gateway:
    port = free_port()
    own_store = any(a.startswith("store.url=") for a in command)
    proc = launch.start_gateway(
        port=port,
        key=KEY,
        log_level="warning",
        store_url=None if own_store else f"sqlite:///{workdir / f'gateway-{port}.db'}",
        log_path=workdir / f"gateway-{port}.log",
        cwd=ROOT,
        command=pinned(command, "gateway"),
        name=f"gateway {label}",
        ready_timeout=120,  # a busy machine starts it slowly
    )
    return Gateway(label, proc.url, proc)


def prepare(
    gateway: Gateway, model_url: str, n: int, tag: str, tokens: bool = False
) -> tuple[list[str], list[str]]:
    """n rollouts' proxy URLs, and the key each agent sends: the admin key, or (`tokens`) the
    agent token of its attempt, as the Controller hands out."""
    with GatewayClient(gateway.url, KEY) as client:
        client.delete_models()
        client.register_models([Model(model="policy", endpoint=f"{model_url}/v1")])
        ids = [f"{tag}-{i}" for i in range(n)]
        for start in range(0, n, 500):
            client.create_rollouts(
                [RolloutCreate(rollout_id=r, input={"i": r}) for r in ids[start : start + 500]]
            )
        keys = [client.mint_agent_token(r, "a").token for r in ids] if tokens else [KEY] * n
    base = f"{gateway.url}/proxy/rollout/{{}}/attempt/a/mode/train/openai/v1/chat/completions"
    return [base.format(r) for r in ids], keys


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def recorded(gateway: Gateway, tag: str, n: int) -> int:
    with GatewayClient(gateway.url, KEY, timeout=60) as client:
        return sum(a.n_events for i in range(n) for a in client.get_rollout(f"{tag}-{i}").attempt_details)


# --- the report -----------------------------------------------------------------------------


def measure(
    urls: list[str], keys: list[str], args: argparse.Namespace, model: ManagedProcess, gw: Gateway | None
) -> dict[str, Any]:
    """One load run, with the CPU time per call of each process."""
    before = cpu_seconds(model.pid), cpu_seconds(gw.process.pid) if gw else 0.0
    result = run_load(urls, args.duration, args.warmup, keys, args.turns)
    calls = max(result["total"], 1)
    cpu_ms = [result["cpu_ms_per_call"], (cpu_seconds(model.pid) - before[0]) * 1000 / calls]
    if gw is not None:
        cpu_ms.append((cpu_seconds(gw.process.pid) - before[1]) * 1000 / calls)
    return {**result, "cpu_ms": cpu_ms}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput; errors summed over all runs; each process's CPU per
    call the median over all runs (on a shared machine one run's CPU figures jump with the load)."""
    chosen = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
    kinds: dict[str, int] = {}
    for r in runs:
        for kind, count in r["errors"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    cpu_ms = [statistics.median(ms) for ms in zip(*(r["cpu_ms"] for r in runs), strict=True)]
    cpu = "/".join(f"{ms:.2f}" for ms in cpu_ms)
    return {**chosen, "errors": sum(kinds.values()), "error_kinds": kinds, "cpu": cpu, "cpu_ms": cpu_ms}


def fmt_row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--scenarios",
        default="16:0.05,64:0.05,256:0.05,1024:1.0",
        help="comma-separated CALLS_IN_FLIGHT:MODEL_DELAY_SECONDS (default: the issues' four)",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per path, interleaved; the median-throughput run is shown"
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="give the gateway CPU 0 to itself and the load generator and model server the others",
    )
    parser.add_argument(
        "--agent-tokens",
        action="store_true",
        help="also run each gateway with agents holding their own agent tokens instead of the admin key",
    )
    parser.add_argument(
        "--gateway-cmd",
        action="append",
        default=[],
        help="another gateway command to benchmark side by side (repeatable)",
    )
    parser.add_argument(
        "--token-exact",
        action="store_true",
        help="the model also serves vLLM's scale-out endpoints; run 'ours' on pass-through "
        "(default_proxy.token_exact=false) and 'exact' on the token path, side by side",
    )
    parser.add_argument(
        "--metrics-off",
        action="store_true",
        help="also run a gateway with metrics.enabled=false and print the metrics on/off throughput ratio",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="calls per conversation: each agent sends the model's answer and a next question back, "
        "TURNS calls long, then starts over (default 1: every call the same question). On the token "
        "path, a call that goes on from an earlier answer is served with render, generate and "
        "derender; a conversation's first call with the server's chat API",
    )
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny sizes: that it runs")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:  # the suite's check that it runs: one small scenario, a second of load
        args.scenarios, args.duration, args.warmup, args.repeat = "8:0.01", 0.5, 0.3, 1
        args.token_exact, args.turns = True, max(args.turns, 2)  # both paths, calls that go on

    scenarios = []
    for item in args.scenarios.split(","):
        n, delay = item.split(":")
        scenarios.append((int(n), float(delay)))
    commands = [("ours", launch.gateway_command())]
    if args.token_exact:
        commands = [
            ("ours", [*launch.gateway_command(), "default_proxy.token_exact=false"]),
            ("exact", launch.gateway_command()),
        ]
    if args.metrics_off:
        commands.append(("no-metrics", [*launch.gateway_command(), "metrics.enabled=false"]))
    commands += [(f"cmd{i + 1}", shlex.split(c)) for i, c in enumerate(args.gateway_cmd)]

    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) >= 2:
        PLACEMENT["gateway"], PLACEMENT["others"] = {cpus[0]}, set(cpus[1:])
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} before the run")
    if PLACEMENT["gateway"] is not None:
        print(
            f"CPUs: gateway {sorted(PLACEMENT['gateway'])}; load generator and model server {sorted(PLACEMENT['others'] or [])}"
        )
    else:
        print("CPUs: not pinned")
    for label, command in commands[1:]:
        print(f"{label}: {shlex.join(command)}")
    header = [
        "in flight",
        "model",
        "path",
        "calls/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "+p50 ms",
        "+p99 ms",
        "errors",
        "saved",
        "cpu ms/call",
        "target",
    ]
    widths = [9, 6, 10, 8, 6, 8, 8, 8, 8, 6, 7, 16, 36]
    print(fmt_row(header, widths))
    failures = 0
    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        workdir = Path(tmp)
        for n, delay in scenarios:
            model_url, model = start_model(delay, workdir, args.token_exact)
            gateways: list[Gateway] = []
            try:
                for label, cmd in commands:  # inside the try: one that fails to start stops the others
                    gateways.append(start_gateway(label, cmd, workdir))
                paths: dict[str, tuple[list[str], list[str], Gateway | None]] = {
                    "direct": ([f"{model_url}/v1/chat/completions"] * n, [KEY] * n, None)
                }
                via_paths: list[tuple[str, Gateway, str]] = []  # (path name, gateway, rollout tag)
                for gw in gateways:
                    for tokens in (False, True) if args.agent_tokens else (False,):
                        label = f"{gw.label}+tok" if tokens else gw.label
                        tag = f"bench-{n}-{label}"
                        paths[f"via {label}"] = (*prepare(gw, model_url, n, tag, tokens), gw)
                        via_paths.append((label, gw, tag))
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
                for _ in range(args.repeat):  # interleaved, so that a change in machine load hits all paths
                    for name, (urls, keys, through) in paths.items():
                        runs[name].append(measure(urls, keys, args, model, through))
                medians = {name: median_run(r) for name, r in runs.items()}
                direct = medians["direct"]
                cells = [str(n), f"{delay * 1000:.0f}ms", "direct", f"{direct['rps']:.0f}", "1.00"]
                cells += [f"{direct['p50_ms']:.1f}", f"{direct['p99_ms']:.1f}", "", ""]
                cells += [str(direct["errors"]), "", direct["cpu"], ""]
                print(fmt_row(cells, widths), flush=True)
                for label, gw, tag in via_paths:
                    via = medians[f"via {label}"]
                    ratio = via["rps"] / direct["rps"] if direct["rps"] else float("nan")
                    added50 = via["p50_ms"] - direct["p50_ms"]
                    added99 = via["p99_ms"] - direct["p99_ms"]
                    saved = recorded(gw, tag, n)
                    verdict = ""
                    target = targets_of(label).get((n, delay))
                    if target is not None:
                        ok, want = target.check(ratio, added50, via["cpu_ms"][-1], via["errors"])
                        verdict = ("PASS " if ok else "FAIL ") + want
                        failures += not ok
                    cells = [
                        str(n),
                        f"{delay * 1000:.0f}ms",
                        f"via {label}",
                        f"{via['rps']:.0f}",
                        f"{ratio:.2f}",
                    ]
                    cells += [
                        f"{via['p50_ms']:.1f}",
                        f"{via['p99_ms']:.1f}",
                        f"{added50:+.1f}",
                        f"{added99:+.1f}",
                    ]
                    cells += [str(via["errors"]), str(saved), via["cpu"], verdict]
                    print(fmt_row(cells, widths), flush=True)
                    if via["error_kinds"]:
                        print(f"    errors via {label}: {via['error_kinds']}")
                if args.metrics_off:
                    on, off = medians["via ours"], medians["via no-metrics"]
                    ratio = on["rps"] / off["rps"] if off["rps"] else float("nan")
                    verdict = "PASS" if ratio >= 0.95 else "FAIL"
                    failures += verdict == "FAIL"
                    print(
                        f"    metrics on/off: {on['rps']:.0f} / {off['rps']:.0f} calls/s = {ratio:.3f} "
                        f"({verdict} >= 0.95); p50 {on['p50_ms']:.1f} / {off['p50_ms']:.1f} ms; "
                        f"cpu ms/call {on['cpu']} / {off['cpu']}",
                        flush=True,
                    )
            finally:
                for gw in gateways:
                    gw.process.stop()
                model.stop()
    print(f"load average {os.getloadavg()[0]:.2f} after the run")
    print(
        "calls/s and latencies: of the median run (by calls/s) of each path; errors: failed calls, all runs"
    )
    print("+p50/+p99: latency added by the gateway; saved: model_request events in its store (every call)")
    print(
        "cpu ms/call: CPU time per call of the load generator / the model server / the gateway, median of the runs"
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
