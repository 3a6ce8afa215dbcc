"""The proxy's per-call recording cost, before and after delta storage, side by side.

Every proxied call is turned into a stored event on the Gateway's event loop: the triplet
view, the encoding, and (after) the split into a delta and the per-attempt index lookup. This
times exactly that — `make_record` + `append_event` into the memory store, so the SQLite
writer thread's work is left out — for a short call (the proxy benchmark's two-message chat)
and for the calls of a long agent (30 calls, contexts growing to ~19k tokens), each in its own
process for ours-before (`--baseline-ref`, unpacked with `git archive`, or `--baseline-tree`)
and ours-after (this tree). The best of `--rounds` rounds is shown (the machine is shared).

    .venv/bin/python bench/record.py           # 7 rounds in each of 3 processes per side
    .venv/bin/python bench/record.py --smoke   # one round of a few calls: that it runs

The long agent's calls are made once here (bench/collect.py's `long_conversation`) and handed
to both sides as a file, so the code before only has to store them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE_REF = "ac53280"  # the last commit before calls were stored as deltas

SHORT = {
    "api": "chat.completions",
    "mode": "train",
    "request": {
        "model": "x",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. Answer briefly and show your work."},
            {"role": "user", "content": "A train leaves at 3pm at 60 km/h; another at 4pm at 90 km/h. When?"},
        ],
    },
    "params": {"model": "policy", "temperature": 1.0, "return_token_ids": True, "logprobs": True},
    "response": {
        "id": "c",
        "object": "chat.completion",
        "prompt_token_ids": list(range(100, 140)),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "It catches up at 6pm."},
                "finish_reason": "stop",
                "token_ids": list(range(7, 17)),
                "logprobs": {"content": [{"token": "t", "logprob": -0.5, "bytes": [116]} for _ in range(10)]},
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 10},
    },
    "server": {"model": "policy", "endpoint": "http://x", "version": 0},
    "latency_ms": 50.0,
    "http_status": 200,
    "status": "ok",
    "error": None,
    "retries": 0,
    "usage": None,
    "finish_reason": "stop",
    "stream": False,
    "incomplete": False,
}


def worker(rounds: int, calls_file: str, attempts: int) -> None:
    from agentlightning.schemas import Rollout
    from agentlightning.server.events import make_record
    from agentlightning.server.store import MemoryStore

    long_calls = json.loads(Path(calls_file).read_text())

    async def per_call(calls: list[dict[str, Any]], attempts: int) -> float:
        best = float("inf")
        for _ in range(rounds):
            store = MemoryStore()
            await store.create_rollouts([Rollout(rollout_id=f"r{i}", input={}) for i in range(attempts)])
            start = time.perf_counter()
            n = 0
            for i in range(attempts):
                for data in calls:
                    await store.append_event(make_record(f"r{i}", "a1", "model_request", data, 0.0))
                    n += 1
            best = min(best, (time.perf_counter() - start) / n)
        return best

    short = asyncio.run(per_call([SHORT] * 20, attempts))
    long = asyncio.run(per_call(long_calls, 1))
    print(json.dumps({"short_us": short * 1e6, "long_ms": long * 1e3}))


def measure(tree: Path, rounds: int, calls_file: Path, attempts: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [
        sys.executable,
        __file__,
        "--worker",
        f"--rounds={rounds}",
        f"--calls-file={calls_file}",
        f"--attempts={attempts}",
    ]
    done = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="processes per side, interleaved")
    parser.add_argument("--baseline-ref", default=DEFAULT_BASELINE_REF)
    parser.add_argument("--baseline-tree")
    parser.add_argument("--calls", type=int, default=30, help="the long agent's calls")
    parser.add_argument("--attempts", type=int, default=100, help="attempts of 20 short calls")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs end to end")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.calls_file, args.attempts)
        return 0
    if args.smoke:
        args.rounds, args.repeat, args.calls, args.attempts = 1, 1, 4, 2
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.path.insert(0, str(ROOT))
    from bench.collect import long_conversation

    with tempfile.TemporaryDirectory(prefix="agl-bench-record-") as tmp:
        calls_file = Path(tmp) / "long_calls.json"
        long_calls = long_conversation(random.Random(1), args.calls, 2000, 535)[0]
        calls_file.write_text(json.dumps(long_calls))
        average_k = sum(len(c["response"]["prompt_token_ids"]) for c in long_calls) / len(long_calls) / 1000
        if args.baseline_tree:
            base = Path(args.baseline_tree)
        else:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline_ref], capture_output=True
            )
            why = f"cannot unpack the baseline {args.baseline_ref!r} with git archive ({archive.stderr.decode().strip()})"
            if archive.returncode == 0:
                subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            elif args.smoke:  # e.g. a shallow clone: the smoke shows the script runs, not the ratio
                print(f"{why}: both sides are this tree (--smoke only)")
                base = ROOT
            else:
                sys.exit(f"{why}: fetch the history or pass --baseline-tree DIR")
        best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
        for _ in range(args.repeat):
            for name, tree in (("before", base), ("after", ROOT)):
                for key, value in measure(tree, args.rounds, calls_file, args.attempts).items():
                    best[name][key] = min(best[name].get(key, float("inf")), value)
    b, a = best["before"], best["after"]
    print("recording one call on the event loop (make_record + append), best of all rounds:")
    print(
        f"  short call (40-token prompt):        before {b['short_us']:7.1f} us   after {a['short_us']:7.1f} us   after/before {a['short_us'] / b['short_us']:.2f}"
    )
    print(
        f"  long agent's call ({args.calls} calls, avg ~{average_k:.0f}k tokens): before {b['long_ms']:7.2f} ms   after {a['long_ms']:7.2f} ms   after/before {a['long_ms'] / b['long_ms']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
