"""Collecting and aggregating a step's finished rollouts from a local Gateway: ours vs v1.0's way.

Starts a real `agl-server` (SQLite store), fills it with finished rollouts — by default
1,024 rollouts (128 prompts x 8) of 8 tool-calling turns of ~1,500 tokens each, posted as the
proxy records them (raw `model_request` events with token ids and log-probs, then a reward) —
and times, for two identical sets side by side:

* ours: the rollout manager reads the terminal cursor and fetches the triplets with batch
  requests (several in flight); then `build_training_batch` (trajectory aggregation,
  rewards, advantages, shaping, metrics). The rollouts' deletes, which a trainer sends in the
  background when it next waits for rollouts, are timed separately.
* baseline (v1.0's access pattern): one GET per rollout for its state, then its raw and its
  triplet events parsed into Event models, one rollout after the other, then a delete; then
  the same trajectory merge written the v1.0 way (no padding or tensors, which would only
  add to its time).

Usage: .venv/bin/python bench/collect.py [--rollouts 1024] [--calls 8] [--skip-baseline]
Target: ours collects and aggregates the default batch in <= 10 s, aggregation <= 25 % of it.

Long-horizon mode (`--long-horizon`): agents of 10 to 80 calls whose every call re-sends the
whole conversation (a growing message list and its prompt token ids). For each size it runs
ours-before (the code at `--baseline-ref`, unpacked with `git archive`, or `--baseline-tree`:
calls stored whole, collected in the `triplet` format) and ours-after (this tree: calls stored
as deltas, collected in `triplet_delta`) side by side, each with its own Gateway process, and
prints fetch and total time, the store's bytes per rollout (event payloads) against the
rollout's unique content (each call's JSON with its prompt ids and messages cut to those it
adds), the bytes sent to the trainer, and the time the Gateway took to take in the calls
(posted by 8 agents at a time; not part of the collection timings):

    .venv/bin/python bench/collect.py --long-horizon
Targets: 64 rollouts x 30 calls x contexts to ~34k tokens collected in <= 1 s; from 40 to 80
calls the cost grows <= 2.5x; store bytes per rollout <= 2x its unique content.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from agentlightning.client import AsyncGatewayClient, GatewayClient
from agentlightning.log import configure_logging
from agentlightning.procs import ManagedProcess, free_port
from agentlightning.schemas import RolloutState
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.config import CoreConfig, load_core_config
from agentlightning.trainer.manager import RolloutManager

KEY = "bench-key"
VOCAB = 151_000


# --- data -----------------------------------------------------------------------------------


def conversation(rng: random.Random, calls: int, prompt_len: int, turn_len: int) -> list[dict[str, Any]]:
    """The raw model_request payloads of one tool-calling rollout."""
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    out = []
    for _ in range(calls):
        response = [rng.randrange(VOCAB) for _ in range(turn_len)]
        logprobs = [{"token": f"tok{t}", "logprob": -rng.random() * 3, "bytes": None} for t in response]
        out.append(
            {
                "api": "chat.completions",
                "mode": "train",
                "request": {
                    "model": "policy",
                    "messages": [{"role": "user", "content": "x" * (4 * len(prompt) // 3)}],
                    "tools": [{"type": "function", "function": {"name": "calc", "parameters": {}}}],
                },
                "params": {"model": "policy", "temperature": 1.0, "return_token_ids": True, "logprobs": True},
                "response": {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": "policy",
                    "prompt_token_ids": prompt,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "y" * (4 * turn_len)},
                            "finish_reason": "tool_calls",
                            "token_ids": response,
                            "logprobs": {"content": logprobs},
                        }
                    ],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": turn_len},
                },
                "server": {"model": "policy", "endpoint": "http://127.0.0.1:9/v1", "version": 0},
                "latency_ms": 800.0,
                "http_status": 200,
                "status": "ok",
                "retries": 0,
                "finish_reason": "tool_calls",
            }
        )
        tool_output = [rng.randrange(VOCAB) for _ in range(turn_len)]
        prompt = prompt + response + tool_output
    return out


async def populate(url: str, rollout_ids: list[str], args: argparse.Namespace, seed: int) -> None:
    """Run each rollout as an agent would: running, its calls, a reward, succeeded."""
    rng = random.Random(seed)
    payloads = {rid: conversation(rng, args.calls, args.prompt, args.turn) for rid in rollout_ids}
    sem = asyncio.Semaphore(16)
    async with AsyncGatewayClient(url, KEY, timeout=120, max_connections=32) as client:

        async def one(rid: str) -> None:
            async with sem:
                await client.patch_rollout(rid, state=RolloutState.RUNNING, last_attempt_id="a1")
                for data in payloads.pop(rid):
                    await client.post_event(rid, "a1", "model_request", data)
                await client.post_reward(rid, "a1", float(rng.random() < 0.5))
                await client.patch_rollout(rid, state=RolloutState.SUCCEEDED)

        await asyncio.gather(*(one(rid) for rid in rollout_ids))


# --- the baseline: v1.0's access pattern and merge -----------------------------------------


def baseline_collect(url: str, rollout_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    with GatewayClient(url, KEY, timeout=120) as client:
        for rid in rollout_ids:  # v1.0 polled every pending rollout, one GET each
            client.get_rollout(rid)
        for rid in rollout_ids:
            raw = client.get_events(rid)  # raw events, parsed into models
            triplets = client.get_events(rid, format="triplet")
            out.append({"rollout_id": rid, "raw": raw, "triplets": triplets})
            client.delete_rollout(rid)
    return out


def baseline_aggregate(completed: list[dict[str, Any]]) -> int:
    """v1.0's trajectory merge (per triplet lists, log-probs re-checked per call); returns rows."""
    n_rows = 0
    for rollout in completed:
        triplets = []
        reward = None
        for event in rollout["triplets"]:
            data = event.data
            if event.event_type == "reward":
                reward = data.get("value")
                continue
            if data.get("status") == "error" or (data.get("http_status") or 200) >= 400:
                continue
            if not data.get("response_token_ids"):
                continue
            triplets.append(
                {
                    "prompt": {"token_ids": data.get("prompt_token_ids", [])},
                    "response": {
                        "token_ids": data["response_token_ids"],
                        "log_probs": data.get("response_log_probs"),
                    },
                }
            )
        _ = reward
        if not triplets:
            continue
        first = triplets[0]
        prompt_ids = list(first["prompt"]["token_ids"])
        response_ids = list(first["response"]["token_ids"])
        context = prompt_ids + response_ids
        mask = [1] * len(response_ids)
        log_probs = first["response"]["log_probs"]
        for t in triplets[1:]:
            p, r, lp = t["prompt"]["token_ids"], t["response"]["token_ids"], t["response"]["log_probs"]
            nxt = p + r
            if p[: len(context)] == context:
                obs = p[len(context) :]
                response_ids += obs
                mask += [0] * len(obs)
                if log_probs is not None:
                    log_probs = log_probs + [0.0] * len(obs)
                response_ids += r
                mask += [1] * len(r)
                if log_probs is not None:
                    log_probs = None if lp is None or len(lp) != len(r) else log_probs + list(lp)
                context = nxt
                continue
            n_rows += 1
            context, prompt_ids, response_ids, mask, log_probs = nxt, list(p), list(r), [1] * len(r), lp
        n_rows += 1
    return n_rows


# --- ours ---------------------------------------------------------------------------------


def core_config(url: str, n: int, max_length: int = 0) -> CoreConfig:
    return load_core_config(
        {
            "data": {"train_batch_size": 1},
            "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": 1}},
            "agentlightning": {
                "agl_base_url": url,
                "agl_key": KEY,
                "keep_last_rollouts": 0,  # every collected rollout deleted: the deletes are measured
                "trace_aggregator": {
                    "trajectory_max_prompt_length": max_length or 4096,
                    "trajectory_max_response_length": max_length or 8192,
                },
            },
        }
    )


# --- long-horizon mode ----------------------------------------------------------------------

LONG_SIZES = [(32, 10, 2000, 300), (32, 20, 2000, 300), (32, 40, 2000, 300), (32, 80, 2000, 300)]
LONG_WIDE = (64, 30, 2000, 535)  # contexts growing to ~34k tokens
DEFAULT_BASELINE_REF = "ac53280"  # the last commit before calls were stored as deltas


def long_conversation(
    rng: random.Random, calls: int, prompt_len: int, turn_len: int
) -> tuple[list[dict], int]:
    """A chat agent's model_request payloads: every call re-sends the whole message list and
    its prompt ids. Also returns the size of the rollout's unique content: each call's JSON
    with its prompt ids and messages cut to those it adds."""
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s" * (2 * prompt_len)},
        {"role": "user", "content": "u" * (2 * prompt_len)},
    ]
    out, unique = [], 0
    seen_prompt, seen_messages = 0, 0
    for t in range(calls):
        response = [rng.randrange(VOCAB) for _ in range(turn_len)]
        logprobs = [{"token": f"tok{x}", "logprob": -rng.random() * 3, "bytes": None} for x in response]
        data: dict[str, Any] = {
            "api": "chat.completions",
            "mode": "train",
            "request": {
                "model": "policy",
                "messages": list(messages),
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
            },
            "params": {"model": "policy", "temperature": 1.0, "return_token_ids": True, "logprobs": True},
            "response": {
                "id": f"chatcmpl-{t}",
                "object": "chat.completion",
                "model": "policy",
                "prompt_token_ids": list(prompt),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "y" * (4 * turn_len)},
                        "finish_reason": "tool_calls",
                        "token_ids": response,
                        "logprobs": {"content": logprobs},
                    }
                ],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": turn_len},
            },
            "server": {"model": "policy", "endpoint": "http://127.0.0.1:9/v1", "version": 0},
            "latency_ms": 800.0,
            "http_status": 200,
            "status": "ok",
            "retries": 0,
            "finish_reason": "tool_calls",
        }
        out.append(data)
        new = {
            **data,
            "request": {**data["request"], "messages": messages[seen_messages:]},
            "response": {**data["response"], "prompt_token_ids": prompt[seen_prompt:]},
        }
        unique += len(orjson.dumps(new))
        seen_prompt, seen_messages = len(prompt), len(messages)
        tool_output = [rng.randrange(VOCAB) for _ in range(turn_len)]
        prompt = prompt + response + tool_output
        messages = [
            *messages,
            {"role": "assistant", "content": "y" * (4 * turn_len)},
            {"role": "tool", "content": "z" * (4 * turn_len)},
        ]
    return out, unique


def store_payload_bytes(db: Path) -> int:
    """Bytes of the stored events' payloads (whatever columns this tree's schema has)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
        parts = [f"ifnull(sum(length({c})), 0)" for c in ("data", "triplet", "call") if c in columns]
        return int(conn.execute(f"SELECT {' + '.join(parts)} FROM events").fetchone()[0])
    finally:
        conn.close()


def long_worker(args: argparse.Namespace) -> int:
    """One size against one tree's Gateway and manager (`agentlightning` from PYTHONPATH). Its
    command line is built here: that tree may predate `agentlightning.launch`."""
    import agentlightning
    from agentlightning.server.store.sqlite import SCHEMA_VERSION

    delta = SCHEMA_VERSION >= 2
    configure_logging("warning")
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="agl-bench-lh-") as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        db = Path(tmp) / "gateway.db"
        argv_server = [
            sys.executable,
            "-m",
            "agentlightning.server",
            f"port={port}",
            f"key={KEY}",
            f"store.url=sqlite:///{db}",
            "log_level=warning",
        ]
        server = ManagedProcess("agl-server", argv_server, Path(tmp) / "gateway.log").start()
        try:
            server.wait_http_ok(f"{url}/healthz")
            config = core_config(url, args.group, max_length=1_000_000)
            manager = RolloutManager(config)
            groups = manager.submit([{"prompt": i} for i in range(args.rollouts // args.group)], step=0)
            ids = [rid for g in groups for rid in g.rollout_ids]
            unique = 0

            async def populate_long() -> None:
                nonlocal unique
                sem = asyncio.Semaphore(8)
                async with AsyncGatewayClient(url, KEY, timeout=300, max_connections=16) as client:

                    async def one(rid: str) -> None:
                        nonlocal unique
                        calls, u = long_conversation(rng, args.calls, args.prompt, args.turn)
                        unique += u
                        async with sem:
                            await client.patch_rollout(rid, state=RolloutState.RUNNING, last_attempt_id="a1")
                            for data in calls:
                                await client.post_event(rid, "a1", "model_request", data)
                            await client.post_reward(rid, "a1", float(rng.random() < 0.5))
                            await client.patch_rollout(rid, state=RolloutState.SUCCEEDED)

                    await asyncio.gather(*(one(rid) for rid in ids))

            t_ingest = time.perf_counter()
            asyncio.run(populate_long())
            ingest = time.perf_counter() - t_ingest
            stored = store_payload_bytes(db)
            fmt = "triplet_delta" if delta else "triplet"
            sent = 0
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as http:
                for start in range(0, len(ids), 32):  # the manager's requests, once more, untimed
                    body = {"rollout_ids": ids[start : start + 32], "format": fmt}
                    answer = http.post("/api/rollouts/batch/events", json=body)
                    answer.raise_for_status()
                    sent += len(answer.content)
            t0 = time.perf_counter()
            manager.wait(lambda: all(manager.is_done(r) for r in ids))
            collected = manager.take(ids)
            t1 = time.perf_counter()
            batch = build_training_batch(collected, config, step=0, policy_version=0)
            t2 = time.perf_counter()
            manager.close()
            n_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in batch.rows)
            print(
                json.dumps(
                    {
                        "code": str(Path(agentlightning.__file__).parents[1]),
                        "format": fmt,
                        "fetch": t1 - t0,
                        "total": t2 - t0,
                        "store_per_rollout": stored / len(ids),
                        "unique_per_rollout": unique / len(ids),
                        "sent": sent,
                        "ingest": ingest,
                        "rows": len(batch.rows),
                        "row_tokens": n_tokens,
                    }
                )
            )
        finally:
            server.stop()
    return 0


def baseline_tree(args: argparse.Namespace, tmp: str) -> Path:
    if args.baseline_tree:
        return Path(args.baseline_tree)
    root = Path(__file__).resolve().parents[1]
    target = Path(tmp) / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", args.baseline_ref], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def run_worker(tree: Path, rollouts: int, calls: int, prompt: int, turn: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, __file__, "--lh-worker", f"--rollouts={rollouts}", f"--calls={calls}"]
    argv += [f"--prompt={prompt}", f"--turn={turn}", f"--group={min(8, rollouts)}"]
    done = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(done.stdout.strip().splitlines()[-1])


def long_horizon(args: argparse.Namespace) -> int:
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores)")
    ours = Path(__file__).resolve().parents[1]
    sizes = [s for s in LONG_SIZES if not args.sizes or s[1] in args.sizes]
    with tempfile.TemporaryDirectory(prefix="agl-bench-base-") as tmp:
        base = baseline_tree(args, tmp)
        print(
            f"before: {base} ({args.baseline_ref if not args.baseline_tree else 'given tree'}); after: {ours}"
        )
        head = (
            f"{'rollouts x calls (first prompt, turn)':<38} {'':>6} {'fetch':>7} {'total':>7} "
            f"{'store/rollout':>14} {'unique/rollout':>15} {'sent':>9} {'ingest':>8}"
        )
        print(head)
        results: dict[tuple[str, int], dict[str, Any]] = {}
        for rollouts, calls, prompt, turn in [*sizes, LONG_WIDE]:
            for name, tree in (("before", base), ("after", ours)):
                r = run_worker(tree, rollouts, calls, prompt, turn)
                results[(name, calls)] = r
                label = f"{rollouts} x {calls} ({prompt}, {turn})"
                print(
                    f"{label:<38} {name:>6} {r['fetch']:6.2f}s {r['total']:6.2f}s "
                    f"{r['store_per_rollout'] / 1e6:11.2f} MB {r['unique_per_rollout'] / 1e6:12.2f} MB "
                    f"{r['sent'] / 1e6:6.0f} MB {r['ingest']:7.1f}s",
                    flush=True,
                )
            b, a = results[("before", calls)], results[("after", calls)]
            assert (a["rows"], a["row_tokens"]) == (b["rows"], b["row_tokens"]), (
                "before and after built different rows"
            )
            print(
                f"{'':<38} {'ratio':>6} x{b['fetch'] / a['fetch']:5.1f} x{b['total'] / a['total']:5.1f} "
                f"  store x{b['store_per_rollout'] / a['store_per_rollout']:.1f} smaller, "
                f"sent x{b['sent'] / a['sent']:.1f} smaller",
                flush=True,
            )
        wide = results[("after", LONG_WIDE[1])]
        checks = [(f"{LONG_WIDE[0]} x {LONG_WIDE[1]} calls collected in <= 1 s", wide["total"] <= 1.0)]
        if ("after", 40) in results and ("after", 80) in results:
            growth = results[("after", 80)]["total"] / results[("after", 40)]["total"]
            checks.append((f"40 -> 80 calls: total x{growth:.2f} (<= 2.5)", growth <= 2.5))
        worst = max(
            r["store_per_rollout"] / r["unique_per_rollout"] for (n, _), r in results.items() if n == "after"
        )
        checks.append(
            (f"store bytes per rollout <= 2x its unique content (worst x{worst:.2f})", worst <= 2.0)
        )
        for what, ok in checks:
            print(f"target: {what}: {'met' if ok else 'NOT met'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--calls", type=int, default=8, help="model calls per rollout")
    parser.add_argument("--prompt", type=int, default=1000, help="tokens of the first prompt")
    parser.add_argument("--turn", type=int, default=60, help="tokens per response and per tool output")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--long-horizon", action="store_true", help="the long-horizon curve, before/after")
    parser.add_argument(
        "--baseline-ref", default=DEFAULT_BASELINE_REF, help="long-horizon: git ref of 'before'"
    )
    parser.add_argument("--baseline-tree", help="long-horizon: a source tree of 'before' instead of a ref")
    parser.add_argument("--sizes", type=int, nargs="*", help="long-horizon: only these calls per rollout")
    parser.add_argument("--lh-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a few seconds, tiny sizes: that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rollouts, args.group, args.calls, args.prompt, args.turn = 16, 4, 3, 200, 20
    if args.lh_worker:
        return long_worker(args)
    if args.long_horizon:
        return long_horizon(args)
    configure_logging("warning")
    if args.rollouts % args.group:
        parser.error("--rollouts must be a multiple of --group")
    mean_call = args.prompt + args.turn * (args.calls - 1) + args.turn
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores)")
    print(
        f"batch: {args.rollouts} rollouts ({args.rollouts // args.group} prompts x {args.group}), "
        f"{args.calls} calls each, ~{mean_call:.0f} tokens per call on average"
    )

    with tempfile.TemporaryDirectory(prefix="agl-bench-") as tmp:
        # Here, not at the top: the long-horizon worker runs on a baseline tree that may predate it.
        from agentlightning.launch import start_gateway

        server = start_gateway(
            key=KEY,
            store_url=f"sqlite:///{tmp}/gateway.db",
            log_level="warning",
            log_path=Path(tmp) / "gateway.log",
        )
        url = server.url
        try:
            config = core_config(url, args.group)
            manager = RolloutManager(config)
            groups = manager.submit([{"prompt": i} for i in range(args.rollouts // args.group)], step=0)
            ours_ids = [rid for g in groups for rid in g.rollout_ids]
            base_ids = [f"base-{i}" for i in range(args.rollouts)]
            if not args.skip_baseline:
                with GatewayClient(url, KEY) as client:
                    for start in range(0, len(base_ids), 512):
                        client.create_rollouts(
                            {
                                "rollout_id": rid,
                                "input": {},
                                "metadata": {"data_id": f"base-g{i // args.group}"},
                            }
                            for i, rid in enumerate(base_ids[start : start + 512], start)
                        )
            t = time.perf_counter()
            asyncio.run(populate(url, ours_ids, args, seed=1))
            if not args.skip_baseline:
                asyncio.run(populate(url, base_ids, args, seed=1))
            print(f"populated in {time.perf_counter() - t:.1f}s (not part of the timings)")

            # ours
            t0 = time.perf_counter()
            manager.wait(lambda: all(manager.is_done(r) for r in ours_ids))
            collected = manager.take(ours_ids)
            t1 = time.perf_counter()
            batch = build_training_batch(collected, config, step=0, policy_version=0)
            t2 = time.perf_counter()
            t3 = time.perf_counter()
            n_deleted = manager.flush_deletions()
            cleanup = time.perf_counter() - t3
            manager.close()
            fetch, agg = t1 - t0, t2 - t1
            total = fetch + agg
            n_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in batch.rows)
            print(
                f"ours:     fetch {fetch:6.2f}s  aggregation {agg:6.2f}s  total {total:6.2f}s  "
                f"(aggregation {100 * agg / total:.0f}% of total; {len(collected)} rollouts, "
                f"{int(batch.metrics['training/n_sample_collected'])} rows, {n_tokens:,} row tokens)"
            )
            print(
                f"          deletes: {cleanup:.2f}s ({n_deleted} rollouts; a trainer sends them in the background "
                "when it next waits for rollouts)"
            )
            ok = total <= 10.0 and agg <= 0.25 * total
            print(f"target (total <= 10 s, aggregation <= 25%): {'met' if ok else 'NOT met'}")

            if not args.skip_baseline:
                t0 = time.perf_counter()
                completed = baseline_collect(url, base_ids)
                t1 = time.perf_counter()
                n_rows = baseline_aggregate(completed)
                t2 = time.perf_counter()
                b_fetch, b_agg = t1 - t0, t2 - t1
                print(
                    f"baseline: fetch {b_fetch:6.2f}s  aggregation {b_agg:6.2f}s  total {b_fetch + b_agg:6.2f}s  "
                    f"({len(completed)} rollouts, {n_rows} rows)"
                )
                print(
                    f"speed-up: fetch x{b_fetch / fetch:.1f}, aggregation x{b_agg / agg:.1f}, "
                    f"total x{(b_fetch + b_agg) / total:.1f}"
                )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
