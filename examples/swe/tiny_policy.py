"""A tiny policy for mini-swe-agent on one bug family, warmed up on a naive agent's demonstrations
(the demo's recipe, agentlightning/demo, applied to a real harness).

    python -m examples.swe.tiny_policy build OUT [--correct-prob P] [--steps N] [--seed S]
    python -m examples.swe.tiny_policy data DIR          # comparison_{train,train_hard,val}.jsonl
    python -m examples.swe.tiny_policy report RUN_DIR    # a run's figures: metrics, edits per function
    python -m examples.swe.tiny_policy adam-probe MODEL_DIR   # one AdamW step on one ideal group
    python -m examples.swe.tiny_policy eval MODEL_DIR [--tasks val|train] [--temperature 0] [--samples 1]

The harness is mini-swe-agent with its prompts made short (`prompts/short.yaml`,
SWE_MINI_PROMPTS=short). On a `comparison` task the issue names the function and its module; a
naive agent then works in three turns, each a bare bash tool call as mini parses them:

  1. `grep -n -A6 'def FUNC' */MODULE.py` (reads the function),
  2. `sed -i 's/BUGGY LINE/EDITED LINE/' */MODULE.py` (the edit),
  3. `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (mini's submit command).

Its edit is the naive one, "toggle the `=` of the comparison" (`<` -> `<=`, `<=` -> `<`): right for
`is_prime` and `truncate`, wrong for `clamp`, `running_max` and `days_in_month`, where it writes the
right operator only with probability `correct_prob`. The warm-up (supervised, not RL) imitates
those conversations, rendered exactly as the harness sends them (mini's messages through the chat
template the torch engine serves, observations from running the commands), so what RL has to learn
from the reward is which operator each of those three functions needs.

Model and tokenizer are built in code (nothing downloaded): a byte-level BPE trained on this
family's conversations (`agentlightning.tiny_model.bpe_json`) and a small Qwen2.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from examples.swe.bank import bank
from examples.swe.task import Task
from examples.swe.tasks import checkout

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "prompts" / "short.yaml"
FAMILY = "comparison"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TRAIN_SEED, VAL_SEED = 0, 1  # the RL run's tasks: bank seed 0 (train), seed 1 (held out)
DEMO_SEEDS = range(100, 120)  # the demonstrations' tasks: other packages of the same family
# mini-swe-agent's bash tool (minisweagent.models.utils.actions_toolcall.BASH_TOOL, 2.4.6): what the
# harness sends as `tools`; the chat template renders it as "Tools: bash(command)".
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
_COMPARISON = re.compile(r"<=|>=|==|!=|<|>")


@dataclass(frozen=True)
class Edit:
    """The bug of one task: its buggy line, the line that fixes it, the naive agent's edit."""

    function: str
    path: str
    buggy: str
    right: str
    naive: str


def _toggle_equals(text: str) -> str:
    """The naive edit: the comparison's `=` toggled (`<` -> `<=`, `<=` -> `<`, `==` -> `=`...)."""
    match = _COMPARISON.search(text)
    assert match, text
    op = match.group()
    new = {"<": "<=", ">": ">=", "<=": "<", ">=": ">", "==": "!=", "!=": "=="}[op]
    return text[: match.start()] + new + text[match.end() :]


def edit_of(task: Task) -> Edit:
    """The task's buggy line (one line of its patch's `-` side) and its fixes."""
    return _edit(task.patch, task.FAIL_TO_PASS[0])


@cache
def _edit(patch: str, f2p: str) -> Edit:
    lines = patch.splitlines()
    path = lines[0].split("a/", 1)[1]
    minus = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert len(minus) == len(plus) == 1, patch
    buggy, right = minus[0].strip(), plus[0].strip()
    function = f2p.split("::test_", 1)[1].rsplit("_", 1)[0]
    return Edit(function, path, buggy, right, _toggle_equals(buggy))


def family_tasks(seed: int, family: str = FAMILY) -> list[Task]:
    return [t for t in bank(seed) if t.family == family]


def _sed_escape(text: str, replacement: bool = False) -> str:
    special = "\\/&" if replacement else "\\/.*[]^$"
    return "".join("\\" + c if c in special else c for c in text)


def commands(task: Task, edit: str) -> list[str]:
    """The naive agent's three commands on `task`, its edit writing `edit` over the buggy line."""
    e = edit_of(task)
    where = "*/" + e.path.rsplit("/", 1)[1]  # PKG/MODULE.py: the package's name need not be copied
    return [
        f"grep -n -A6 'def {e.function}' {where}",
        f"sed -i 's/{_sed_escape(e.buggy)}/{_sed_escape(edit, replacement=True)}/' {where}",
        SUBMIT,
    ]


def run_command(ws: Path, command: str) -> dict[str, Any]:
    """A command's output as mini's environment reports it (bash -c in the workspace, stderr
    merged); without the sandbox, which changes nothing for these commands."""
    done = subprocess.run(
        ["bash", "-c", command], cwd=ws, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    return {"output": done.stdout + done.stderr, "returncode": done.returncode, "exception_info": ""}


@cache
def _templates() -> dict[str, str]:
    import yaml

    config = yaml.safe_load(PROMPTS.read_text())
    return {
        "system": config["agent"]["system_template"],
        "instance": config["agent"]["instance_template"],
        "observation": config["model"]["observation_template"],
    }


def _render(template: str, **variables: Any) -> str:
    from jinja2 import StrictUndefined, Template

    return Template(template, undefined=StrictUndefined).render(**variables)


def opening(task: Task) -> list[dict[str, Any]]:
    """mini's first two messages under the short prompts."""
    t = _templates()
    return [
        {"role": "system", "content": _render(t["system"])},
        {"role": "user", "content": _render(t["instance"], task=task.problem_statement)},
    ]


def tool_turn(command: str, k: int) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        ],
    }


def observation(output: dict[str, Any], k: int) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": f"call_{k}",
        "content": _render(_templates()["observation"], output=output),
    }


def turn_text(command: str) -> str:
    """A tool-call turn as the model writes it (bare, canonical JSON), then the end of turn."""
    return f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': {'command': command}})}\n</tool_call><|im_end|>"


def conversation(task: Task, edit: str) -> list[dict[str, Any]]:
    """The whole conversation of the naive agent writing `edit`, as mini holds it (the tool
    results from running the commands in a checkout), ending with the submit call."""
    with tempfile.TemporaryDirectory(prefix="agl-tiny-") as tmp:
        ws = checkout(task, Path(tmp) / "ws")
        messages = opening(task)
        for k, command in enumerate(commands(task, edit)):
            messages.append(tool_turn(command, k))
            if command != SUBMIT:
                messages.append(observation(run_command(ws, command), k))
    return messages


def render(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and its loss mask (1 on the assistant turns), turn by turn as
    the harness's calls render it; checks that each call's prompt extends the previous call's
    prompt + response exactly (the template re-renders the model's turns byte for byte)."""
    ids: list[int] = []
    mask: list[int] = []
    text = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:k], tools=[BASH_TOOL], add_generation_prompt=True, tokenize=False
        )
        assert prompt.startswith(text), "the chat template does not re-render an earlier turn exactly"
        turn = turn_text(json.loads(message["tool_calls"][0]["function"]["arguments"])["command"])
        for piece, trainable in ((prompt[len(text) :], 0), (turn, 1)):
            piece_ids = tokenizer.encode(piece, add_special_tokens=False)
            ids += piece_ids
            mask += [trainable] * len(piece_ids)
        text = prompt + turn
    return ids, mask


def as_text(messages: list[dict[str, Any]]) -> str:
    """A conversation as one string, the tokenizer's training text (template markers included)."""
    from agentlightning.tiny_model import byte_tokenizer

    ids, _ = render(byte_tokenizer(), messages)
    return byte_tokenizer().decode(ids, skip_special_tokens=False)


def demonstrations(
    n: int, seed: int, correct_prob: float, seeds: range = DEMO_SEEDS
) -> list[tuple[Task, str, list[dict[str, Any]]]]:
    """n conversations of the naive agent: (task, edit it wrote, messages)."""
    rng = random.Random(seed)
    tasks = [t for s in seeds for t in family_tasks(s)]
    conversations = {}
    out = []
    for _ in range(n):
        task = rng.choice(tasks)
        e = edit_of(task)
        edit = e.right if e.naive == e.right or rng.random() < correct_prob else e.naive
        key = (task.instance_id, edit)
        if key not in conversations:
            conversations[key] = conversation(task, edit)
        out.append((task, edit, conversations[key]))
    return out


# --- the tiny model -------------------------------------------------------------------------------


@dataclass
class TinyConfig:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    correct_prob: float = 0.3
    steps: int = 500
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0


def build(out: Path, cfg: TinyConfig) -> dict[str, Any]:
    """Tokenizer, model, warm-up; saved to `out` (a Hugging Face directory for `--model`)."""
    import time

    import torch

    from agentlightning.demo.warmup import sft
    from agentlightning.tiny_model import (
        TinyModelConfig,
        bpe_json,
        build_model,
        save_tiny,
        tokenizer_from_json,
    )

    started = time.perf_counter()
    corpus = [as_text(m) for _, _, m in demonstrations(400, cfg.seed + 1, correct_prob=1.0)]
    tokenizer = tokenizer_from_json(bpe_json(corpus, cfg.vocab_size))
    # TinyConfig's size fields are TinyModelConfig's (flat, for the command line).
    model_cfg = TinyModelConfig(
        **{f.name: getattr(cfg, f.name) for f in fields(TinyModelConfig) if hasattr(cfg, f.name)}
    )
    model = build_model(model_cfg, seed=cfg.seed, tokenizer=tokenizer)
    demos = demonstrations(cfg.steps * cfg.batch_size, cfg.seed, cfg.correct_prob)
    examples = [render(tokenizer, m) for _, _, m in demos]
    lengths = sorted(len(ids) for ids, _ in examples)
    torch.manual_seed(cfg.seed)
    stats = sft(model, tokenizer, examples, cfg.steps, cfg.batch_size, cfg.lr)
    save_tiny(out, model, tokenizer)
    info = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "tokens_per_conversation": {"median": lengths[len(lengths) // 2], "max": lengths[-1]},
        "demonstrations_right": sum(edit == edit_of(t).right for t, edit, _ in demos) / len(demos),
        **stats,
        "total_s": time.perf_counter() - started,
        "config": cfg.__dict__,
    }
    (out / "tiny_policy.json").write_text(json.dumps(info, indent=1))
    return info


# --- offline check: the harness's three turns, generated by the model -----------------------------


def parse_command(text: str) -> str | None:
    m = re.search(r"<tool_call>\n(.*)\n</tool_call>", text, re.S)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
        return str(call["arguments"]["command"])
    except (ValueError, KeyError, TypeError):
        return None


def play(model: Any, tokenizer: Any, task: Task, temperature: float, rng_seed: int = 0) -> dict[str, Any]:
    """The model through the harness's conversation (mini's messages, its step loop, up to 4
    calls), commands run in a checkout; the outcome judged by the edited module against the fix."""
    import torch

    torch.manual_seed(rng_seed)
    e = edit_of(task)
    with tempfile.TemporaryDirectory(prefix="agl-tiny-") as tmp:
        ws = checkout(task, Path(tmp) / "ws")
        messages = opening(task)
        edits: list[str] = []
        texts: list[str] = []
        submitted = False
        for k in range(4):
            text = tokenizer.apply_chat_template(
                messages, tools=[BASH_TOOL], add_generation_prompt=True, tokenize=False
            )
            prompt = tokenizer.encode(text, add_special_tokens=False)
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(
                    ids,
                    max_new_tokens=160,
                    do_sample=temperature > 0,
                    temperature=temperature or None,
                    top_p=None,
                    top_k=None,
                )
            text = tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)
            command = parse_command(text)
            texts.append(text)
            if command is None:
                break
            messages.append(tool_turn(command, k))
            if command == SUBMIT:
                submitted = True
                break
            if command.startswith("sed -i"):
                edits.append(command)
            messages.append(observation(run_command(ws, command), k))
        line = next(
            (
                ln.strip()
                for ln in (ws / e.path).read_text().splitlines()
                if ln.strip() in {e.buggy, e.right, e.naive}
            ),
            None,
        )
    verdict = (
        "right"
        if line == e.right
        else "naive"
        if line == e.naive
        else "unchanged"
        if line == e.buggy
        else "other"
    )
    return {
        "function": e.function,
        "verdict": verdict,
        "submitted": submitted,
        "calls": k + 1,
        "edits": edits,
        "texts": texts,
    }


def evaluate(model_dir: Path, tasks: list[Task], temperature: float, samples: int) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen2ForCausalLM.from_pretrained(model_dir).eval()
    per: dict[str, Counter] = {}
    for task in tasks:
        for s in range(samples):
            r = play(model, tokenizer, task, temperature, s)
            per.setdefault(r["function"], Counter())[r["verdict"] if r["submitted"] else "not submitted"] += 1
    total = sum(sum(c.values()) for c in per.values())
    right = sum(c["right"] for c in per.values())
    return {
        "solve_rate": right / total,
        "n": total,
        "per_function": {f: dict(c) for f, c in sorted(per.items())},
    }


def val_tasks(per_function: int = 3) -> list[Task]:
    """Held-out tasks (seed 1), the same number per buggy function (5 functions)."""
    seen: Counter = Counter()
    out = []
    for task in family_tasks(VAL_SEED):
        if seen[edit_of(task).function] < per_function:
            seen[edit_of(task).function] += 1
            out.append(task)
    return out


def write_data(out: Path, per_function: int) -> None:
    """In `out`: {FAMILY}_train.jsonl (all of seed 0's), {FAMILY}_train_hard.jsonl (those of them
    the naive edit does not fix: clamp, running_max, days_in_month) and {FAMILY}_val.jsonl
    (val_tasks)."""
    out.mkdir(parents=True, exist_ok=True)
    train = family_tasks(TRAIN_SEED)
    hard = [t for t in train if edit_of(t).naive != edit_of(t).right]
    for name, tasks in (("train", train), ("train_hard", hard), ("val", val_tasks(per_function))):
        rows = [json.dumps({"task_id": t.instance_id}) + "\n" for t in tasks]
        (out / f"{FAMILY}_{name}.jsonl").write_text("".join(rows))


def _edit_picked(task: Task, log: str) -> str:
    e = edit_of(task)
    flat = "".join(log.split())  # mini's console output wraps long lines at spaces
    for name, edit in (("right", e.right), ("naive", e.naive)):
        if "".join(commands(task, edit)[1].split()) in flat:
            return name
    return "other" if "sed -i" in log else "none"


def report(run_dir: Path, per_step: int, val_size: int) -> dict[str, Any]:
    """Per training step and per validation of a run_local.sh run (RUN_DIR): the trainer's metrics
    and, from the agents' logs, which edit each rollout made, per buggy function. Rollouts are put
    in steps by when their log was last written (training: `per_step` = batch x n a step,
    validation: `val_size` each)."""
    from agentlightning.trainer.tracking import METRICS_FILE, read_metrics
    from examples.swe.bank import find

    metrics = read_metrics(run_dir / "trainer" / METRICS_FILE)
    keys = ("training/reward", "val/reward", "timing/collect_s", "timing/step_s", "timing/validation_s",
            "training/n_zero_adv_groups", "training/n_groups", "actor/ppo_kl", "actor/entropy",
            "actor/grad_norm", "perf/update_time_s", "training/n_unmerged_rollouts", "training/n_rollouts")  # fmt: skip
    steps = [{"step": int(r["step"]), **{k: r[k] for k in keys if k in r}} for r in metrics]
    done: dict[str, list[tuple[float, Task, str]]] = {"t": [], "v": []}
    for attempt in run_dir.glob("agents/*/*.log"):
        parts = attempt.parent.name.rsplit("-", 2)  # RUN-t<i>-<k> (training), RUN-v<i>-0 (validation)
        kind = parts[1][:1] if len(parts) == 3 else ""
        log = attempt.read_text(errors="replace")
        graded = [json.loads(line) for line in log.splitlines() if line.startswith('{"instance_id"')]
        if graded and kind in done:
            task = find(graded[-1]["instance_id"])
            done[kind].append((attempt.stat().st_mtime, task, _edit_picked(task, log)))
    picks: dict[str, dict[str, Counter]] = {}
    for kind, size, name in (("t", per_step, "train step"), ("v", val_size, "validation")):
        for rank, (_, task, pick) in enumerate(sorted(done[kind], key=lambda x: x[0])):
            label = f"{name} {rank // size + 1}"
            picks.setdefault(label, {}).setdefault(edit_of(task).function, Counter())[pick] += 1
    return {
        "steps": steps,
        "edits": {k: {f: dict(c) for f, c in sorted(v.items())} for k, v in picks.items()},
    }


def adam_probe(model_dir: Path, function: str = "clamp") -> dict[str, Any]:
    """How far one AdamW step on one ideal GRPO group moves the decision: the group is 2 right and
    2 naive conversations of one task (advantages +1, -1; token-mean policy-gradient loss over the
    model's turns); p(right operator) and p(naive operator) at the first token where they differ,
    before and after one step at a few learning rates and Adam eps."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = next(t for t in family_tasks(TRAIN_SEED) if edit_of(t).function == function)
    e = edit_of(task)
    right, naive = (
        render(tokenizer, conversation(task, e.right)),
        render(tokenizer, conversation(task, e.naive)),
    )
    at = next(i for i, (a, b) in enumerate(zip(right[0], naive[0], strict=False)) if a != b)

    def decision(model: Any) -> list[float]:
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([right[0][:at]])).logits[0, -1], -1)
        return [round(probs[right[0][at]].item(), 3), round(probs[naive[0][at]].item(), 3)]

    def gradient(model: Any) -> None:
        loss, count = torch.zeros(()), 0.0
        for (ids, mask), advantage in ((right, 1.0), (right, 1.0), (naive, -1.0), (naive, -1.0)):
            x = torch.tensor([ids])
            logp = torch.log_softmax(model(x).logits[0, :-1], -1).gather(1, x[0, 1:, None])[:, 0]
            weights = torch.tensor(mask[1:], dtype=torch.float)
            loss, count = loss - advantage * (logp * weights).sum(), count + weights.sum().item()
        (loss / count).backward()

    base = Qwen2ForCausalLM.from_pretrained(model_dir)
    gradient(base)
    grads = torch.cat([p.grad.flatten().abs() for p in base.parameters() if p.grad is not None])
    out: dict[str, Any] = {
        "function": function,
        "before [p_right, p_naive]": decision(base),
        "grad_norm": round(grads.norm().item(), 4),
        "grad_coordinate_quantiles": {
            q: float(f"{torch.quantile(grads[:1_000_000], q).item():.2e}") for q in (0.5, 0.99, 0.999)
        },
    }
    for eps in (1e-8, 1e-5):
        for lr in (3e-4, 5e-4, 1e-3):
            model = Qwen2ForCausalLM.from_pretrained(model_dir)
            for p, q in zip(model.parameters(), base.parameters(), strict=True):
                p.grad = None if q.grad is None else q.grad.clone()
            torch.optim.AdamW(model.parameters(), lr=lr, eps=eps, weight_decay=0.0).step()
            out[f"after one step, lr {lr:g}, eps {eps:g}"] = decision(model)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.tiny_policy", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="tokenizer + tiny Qwen2 + warm-up, saved as a HF model dir")
    b.add_argument("out", type=Path)
    for field, value in TinyConfig().__dict__.items():
        b.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    d = sub.add_parser(
        "data", help=f"{FAMILY}_train.jsonl (seed {TRAIN_SEED}) and {FAMILY}_val.jsonl (seed {VAL_SEED})"
    )
    d.add_argument("out", type=Path)
    d.add_argument("--val-per-function", type=int, default=3)
    e = sub.add_parser("eval", help="the model through the harness's turns, offline (no Gateway)")
    e.add_argument("model", type=Path)
    e.add_argument("--tasks", choices=("val", "train"), default="val", help="val_tasks() or seed 0's")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--samples", type=int, default=1)
    r = sub.add_parser("report", help="a run_local.sh run's figures: metrics per step, edits per function")
    r.add_argument("run_dir", type=Path)
    r.add_argument("--per-step", type=int, default=12, help="rollouts a training step (batch x n)")
    r.add_argument("--val-size", type=int, default=15, help="rollouts a validation")
    a = sub.add_parser("adam-probe", help="one AdamW step on one ideal group: how far the decision moves")
    a.add_argument("model", type=Path)
    a.add_argument("--function", default="clamp")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        import torch

        torch.set_num_threads(1)
        cfg = TinyConfig(**{f: getattr(args, f) for f in TinyConfig().__dict__})
        print(json.dumps(build(args.out, cfg), indent=1))
    elif args.cmd == "data":
        write_data(args.out, args.val_per_function)
    elif args.cmd == "adam-probe":
        print(json.dumps(adam_probe(args.model, args.function), indent=1))
    elif args.cmd == "report":
        print(json.dumps(report(args.run_dir, args.per_step, args.val_size), indent=1))
    else:
        print(
            json.dumps(
                evaluate(
                    args.model,
                    val_tasks() if args.tasks == "val" else family_tasks(TRAIN_SEED),
                    args.temperature,
                    args.samples,
                ),
                indent=1,
            )
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
