"""Can GRPO on the demo's tiny model and task raise validation reward by >= 0.3 in 10 minutes?

An in-process rehearsal of the demo's training loop, without the Gateway, Controller or agent
processes: the real demo agent (`agentlightning.demo.agent.solve`, official `openai` client,
over httpx2, the SDK's HTTP client) talks to the real inference server app (`build_app` over
`EngineBackend`, served in this process's event loop on a local port); a small recording
transport plays the Gateway proxy's part (it sets the temperature,
`return_token_ids` and `logprobs`, and records every answer). Rollouts are merged into rows
by exact token-prefix (trajectory aggregation), given GRPO advantages and per-rollout loss
weights, and fed to `PolicyUpdater`; new weights are published to the engine after each step.

    .venv/bin/python bench/demo_feasibility.py --seeds 0 1 2 --minutes 10
    .venv/bin/python bench/demo_feasibility.py --smoke   # a short warm-up, 2 small steps: that it runs

Prints one JSON line per validation and a summary per seed. Wall times include whatever else
runs on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx2  # the OpenAI SDK's HTTP client (its http_client must be one)
import torch
from aiohttp import web

from agentlightning.aggregation import AggregationLevel, AggregationStats, Call, RowLimits, aggregate_calls
from agentlightning.demo.agent import solve
from agentlightning.demo.task import ACTIONS, make_dataset, reward
from agentlightning.demo.warmup import WarmupConfig, warmup
from agentlightning.openai_server.app import build_app
from agentlightning.procs import free_port
from agentlightning.rows import TrainingRow
from agentlightning.tiny_model import TinyModelConfig, build_tiny
from agentlightning.torch_backend.engine import TorchEngine
from agentlightning.torch_backend.openai_backend import EngineBackend
from agentlightning.torch_backend.policy import ActorConfig, OptimConfig, PolicyUpdater
from agentlightning.trainer.advantage import assign_advantages, rollout_advantages
from agentlightning.trainer.shaping import split_minibatches

warnings.filterwarnings("ignore")


@dataclass
class Recorder(httpx2.AsyncBaseTransport):
    """The proxy's part: rewrite the body like the Gateway does and record each answer."""

    inner: httpx2.AsyncBaseTransport
    temperature: float = 1.0
    calls: dict[str, list[Call]] = field(default_factory=lambda: defaultdict(list))

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        body.update(temperature=self.temperature, return_token_ids=True, logprobs=True)
        rollout = request.headers.get("x-rollout", "")
        fwd = httpx2.Request(request.method, request.url, json=body)
        response = await self.inner.handle_async_request(fwd)
        raw = await response.aread()
        data = json.loads(raw)
        if response.status_code == 200:
            choice = data["choices"][0]
            lps = [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []]
            self.calls[rollout].append(
                Call(data["prompt_token_ids"], choice["token_ids"], lps if lps else None, 0)
            )
        return httpx2.Response(response.status_code, headers=response.headers, content=raw)


def diagnose(problem: dict[str, Any], calls: list[Call], tokenizer: Any) -> str:
    """Why a validation rollout failed: format, copy of the number, operation, amount, answer."""
    x = int(re.findall(r"\d", problem["question"])[0])
    op = next(o for o, words in ACTIONS.items() if any(w in problem["question"] for w in words))
    if not calls:
        return "no_call"
    text = tokenizer.decode(calls[0].response_ids, skip_special_tokens=True)
    m = re.search(r'"expression": "(\d+)([-+*])(\d+)"', text)
    if m is None:
        return "bad_tool_call"
    if int(m.group(1)) != x:
        return "wrong_number"
    if m.group(2) != op[0]:
        return "wrong_operation"
    if m.group(3) != op[1:]:
        return "wrong_amount"
    if len(calls) < 2:
        return "no_answer_call"
    return "wrong_answer_copy"


class Harness:
    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine

    async def run(self, problems: list[dict[str, Any]], n: int, temperature: float, tag: str) -> Any:
        # The app is served in this event loop (each collection runs its own loop, and an aiohttp
        # app belongs to one loop: a new one each time).
        runner = web.AppRunner(build_app(EngineBackend(self.engine, "policy")))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await self._collect(port, problems, n, temperature, tag)
        finally:
            await runner.cleanup()

    async def _collect(
        self, port: int, problems: list[dict[str, Any]], n: int, temperature: float, tag: str
    ) -> Any:
        recorder = Recorder(httpx2.AsyncHTTPTransport(), temperature)
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="x",
            http_client=httpx2.AsyncClient(transport=recorder, timeout=600),
            max_retries=0,
        )
        results: dict[str, tuple[str, float]] = {}

        async def one(p: dict[str, Any], k: int) -> None:
            rid = f"{tag}-{p['id']}-{k}"
            answer = await solve(client, p["question"], extra_headers={"x-rollout": rid})
            results[rid] = (p["id"], reward(answer, p["answer"]))

        await asyncio.gather(*(one(p, k) for p in problems for k in range(n)))
        await client.close()
        return results, recorder.calls


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    cfg = TinyModelConfig(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers
    )
    model, tok = build_tiny(cfg, seed=seed)
    t_start = time.perf_counter()
    wm = warmup(
        model,
        tok,
        WarmupConfig(
            steps=args.warmup_steps,
            batch_size=args.warmup_batch,
            lr=args.warmup_lr,
            seed=seed,
            correct_op_prob=args.demo_correct,
        ),
    )
    t_warm = time.perf_counter() - t_start
    serve_model, _ = build_tiny(cfg, seed=seed)
    serve_model.load_state_dict(model.state_dict())
    engine = TorchEngine(serve_model, tok, seed=seed)
    harness = Harness(engine)
    actor = ActorConfig(
        optim=OptimConfig(lr=args.lr, weight_decay=0.0),
        ppo_micro_batch_size_per_gpu=args.micro,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        grad_clip=1.0,
        temperature=1.0,
    )
    updater = PolicyUpdater(model, actor)
    val = make_dataset(args.val_size, seed=10_000 + seed, prefix="v")
    train_rng = random.Random(seed)

    def validate(step: int, t_train: float) -> dict[str, Any]:
        out: dict[str, Any] = {"seed": seed, "step": step, "train_s": round(t_train, 1)}
        for temp in args.val_temps:
            t0 = time.perf_counter()
            res, calls = asyncio.run(harness.run(val, 1, temp, f"val{step}"))
            out[f"val_T{temp}"] = round(statistics.fmean(r for _, r in res.values()), 3)
            out[f"val_T{temp}_s"] = round(time.perf_counter() - t0, 1)
            by_id = {p["id"]: p for p in val}
            failures = Counter(
                diagnose(by_id[gid], calls[rid], tok) for rid, (gid, value) in res.items() if value == 0.0
            )
            out[f"val_T{temp}_failures"] = dict(failures)
        print(json.dumps(out), flush=True)
        return out

    history = [validate(0, 0.0)]
    t_train = 0.0
    step = 0
    merges = breaks_total = 0
    budget = args.minutes * 60
    while t_train < budget and step < args.max_steps:
        t0 = time.perf_counter()
        problems = [
            make_dataset(1, seed=train_rng.randrange(10**9), prefix="t")[0] for _ in range(args.batch)
        ]
        res, calls = asyncio.run(harness.run(problems, args.n, 1.0, f"s{step}"))
        t_collect = time.perf_counter() - t0
        adv = rollout_advantages((rid, gid, value) for rid, (gid, value) in res.items())
        stats = AggregationStats()
        rows: list[TrainingRow] = []
        for rid, (gid, value) in res.items():
            rows += aggregate_calls(
                calls[rid], rid, gid, value, AggregationLevel.TRAJECTORY, RowLimits(), stats
            )
        assign_advantages(rows, adv)
        breaks_total += stats.n_merge_mismatch
        n_calls = sum(len(calls[rid]) for rid in res)
        merges += n_calls - (len(res) - stats.n_rollouts_no_calls) - stats.n_merge_mismatch
        # Mini-batches of whole groups, each rollout weighing once (the core's split).
        n_groups = len(set(gid for gid, _ in res.values()))
        minis = split_minibatches(rows, max(1, n_groups // args.mini_batches), shuffle=False)
        t1 = time.perf_counter()
        metrics = updater.update(minis)
        engine.publish(updater.model)
        t_update = time.perf_counter() - t1
        step += 1
        t_train += time.perf_counter() - t0
        mean_r = statistics.fmean(v for _, v in res.values())
        print(
            json.dumps(
                {
                    "seed": seed,
                    "step": step,
                    "train_reward": round(mean_r, 3),
                    "collect_s": round(t_collect, 2),
                    "update_s": round(t_update, 2),
                    "pg_clipfrac": round(metrics.get("actor/pg_clipfrac", 0), 4),
                    "grad_norm": round(metrics.get("actor/grad_norm", 0), 3),
                }
            ),
            flush=True,
        )
        if step % args.val_every == 0:
            history.append(validate(step, t_train))
    if history[-1]["step"] != step:
        history.append(validate(step, t_train))
    engine.close()
    summary = {
        "seed": seed,
        "warmup_s": round(t_warm, 1),
        "warmup_loss": round(wm["warmup/loss"], 4),
        "train_s": round(t_train, 1),
        "steps": step,
        "merged_calls": merges,
        "merge_breaks": breaks_total,
    }
    for temp in args.val_temps:
        key = f"val_T{temp}"
        summary[f"{key}_before"] = history[0][key]
        summary[f"{key}_after"] = history[-1][key]
        summary[f"{key}_gain"] = round(history[-1][key] - history[0][key], 3)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=800)
    ap.add_argument("--warmup-lr", type=float, default=1e-2)
    ap.add_argument("--warmup-batch", type=int, default=16)
    ap.add_argument("--demo-correct", type=float, default=WarmupConfig.correct_op_prob)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=16, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="rollouts per prompt (group size)")
    ap.add_argument("--mini-batches", type=int, default=1)
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--val-size", type=int, default=200)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--val-temps", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs end to end")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.max_steps, args.warmup_steps, args.batch, args.n = [0], 2, 20, 2, 2
        args.val_size, args.val_every = 4, 2
    torch.set_num_threads(args.threads)
    print(json.dumps({"config": vars(args)}), flush=True)
    summaries = [run_seed(args, s) for s in args.seeds]
    for s in summaries:
        print(json.dumps({"summary": s}), flush=True)
    ok = all(s[f"val_T{t}_gain"] >= 0.3 for s in summaries for t in args.val_temps[:1])
    print(f"all seeds gained >= 0.3 (T={args.val_temps[0]}): {ok}", file=sys.stderr)


if __name__ == "__main__":
    main()
