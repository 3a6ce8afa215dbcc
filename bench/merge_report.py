"""How well each example's framework merges its model calls into training rows.

For every harness (Calc-X on AutoGen + MCP, with and without reflection; gsm8k on the plain
`openai` client; the OpenAI Agents SDK; LangGraph), the real agent runs a few rollouts through
a real Gateway and Controller against the scripted Qwen2.5-template model
(`tests/fakes/scripted_model.py`: real chat template, real BPE tokenizer, hermes tool
calls, as vLLM renders them). The trainer core's trajectory aggregation then turns each
rollout into rows. Two model styles: tool-call JSON as the template writes it (`{"name": …,
"arguments": …}` with spaces), and compact JSON (no spaces), which a model may also emit.

    .venv/bin/python -m bench.merge_report [--rollouts 3] [--markdown docs-table.md] [--pass-through]

By default the model serves vLLM's scale-out endpoints, so the Gateway takes its token path
(docs/gateway.md, tokens in / tokens out); `--pass-through` measures without them.

Prints a Markdown table: model calls per rollout, rows per rollout (1.00 = every rollout
merged into one row) and the first reason a merge broke. Needs `.venv-examples` (make).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python bench/merge_report.py`: the stack and policies are in tests/

from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON, RolloutResult, example_stack  # noqa: E402
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer  # noqa: E402


@dataclass(frozen=True)
class Harness:
    label: str
    example: str
    agent: str
    env_map: dict[str, str]
    tool: str
    answer_format: str  # with {n}: the number from the tool's output
    expressions: dict[str, str]  # question substring -> calculator expression
    agent_env: dict[str, str] = field(default_factory=dict)


CALC_X_EXPRESSIONS = {
    "6.6 minus x": "(6.6 - 5.6) / (3/2)",
    "right angle": "90 - 75",
    "piece of cake on the left": "90 / (1/4)",  # the data set's own chain,
}
ARITHMETIC = {"17 boxes": "17 * 24", "(125 - 37)": "(125 - 37) * 3", "1,440 seconds": "1440 / 60"}
CALC_ENV = {"QUESTION": "input.question", "RESULT": "input.result"}
HARNESSES = [
    Harness(
        "Calc-X: AutoGen AgentChat + MCP calculator (v1.0 setting, reflect_on_tool_use=True)",
        "calc_x",
        "calc_agent:CalcAgent",
        CALC_ENV,
        "calculate",
        "### ANSWER: {n} ###",
        CALC_X_EXPRESSIONS,
    ),
    Harness(
        "Calc-X: AutoGen, reflect_on_tool_use=False, max_tool_iterations=3",
        "calc_x",
        "calc_agent:CalcAgent",
        CALC_ENV,
        "calculate",
        "### ANSWER: {n} ###",
        CALC_X_EXPRESSIONS,
        {"CALC_X_REFLECT_ON_TOOL_USE": "0"},
    ),
    Harness(
        "gsm8k: plain `openai` client tool loop",
        "gsm8k",
        "gsm8k_agent:Gsm8kAgent",
        {"QUESTION": "input.question", "ANSWER": "input.answer"},
        "calculator",
        "So the answer is this.\n#### {n}",
        {"baker makes": "24 + 18 - 35", "Tom reads": "12 * 9 + 20 * 3", "6 rows of 8": "6 * 8 * 3 / 16"},
    ),
    Harness(
        "OpenAI Agents SDK, its default model (Responses API)",
        "openai_agents",
        "agents_sdk_agent:AgentsSdkAgent",
        CALC_ENV,
        "calculate",
        "ANSWER: {n}",
        ARITHMETIC,
    ),
    Harness(
        "LangGraph create_react_agent + langchain-openai ChatOpenAI",
        "langgraph",
        "langgraph_agent:LangGraphAgent",
        CALC_ENV,
        "calculate",
        "ANSWER: {n}",
        ARITHMETIC,
    ),
]


@dataclass
class Measured:
    calls: float
    rows: float
    reward: float
    first_break: str | None
    seconds: float


def samples(harness: Harness, n: int) -> list[dict]:
    rows = [
        json.loads(line)
        for line in (EXAMPLES / harness.example / "data" / "sample.jsonl").read_text().splitlines()
    ]
    chosen = [r for r in rows if any(k in r["question"] for k in harness.expressions)]
    return chosen[:n]


def measure(harness: Harness, compact: bool, n: int, work: Path, token_exact: bool = True) -> Measured:
    policy = tool_then_answer(
        harness.tool,
        expression_for(harness.expressions),
        lambda out: harness.answer_format.format(n=number_in(out)),
        compact=compact,
    )
    started = time.perf_counter()
    with example_stack(
        policy, harness.example, work, maximum_size=n, agent_env=harness.agent_env, scale_out=token_exact
    ) as stack:
        results: list[RolloutResult] = stack.run(harness.agent, harness.env_map, samples(harness, n))
    failed = [r for r in results if r.state != "succeeded"]
    if failed:
        raise SystemExit(f"{harness.label}: rollout failed: {failed[0].error}\n{failed[0].log[-2000:]}")
    breaks = [b for b in (r.merge_break() for r in results) if b]
    return Measured(
        calls=statistics.mean(r.stats.n_calls for r in results),
        rows=statistics.mean(len(r.rows) for r in results),
        reward=statistics.mean(r.rewards[-1] if r.rewards else 0.0 for r in results),
        first_break=breaks[0] if breaks else None,
        seconds=time.perf_counter() - started,
    )


def _cell(text: str | None) -> str:
    return "—" if not text else text.replace("|", "\\|").replace("\n", "\\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=3, help="rollouts per harness and model style")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this file")
    parser.add_argument(
        "--pass-through",
        action="store_true",
        help="the model without vLLM's scale-out endpoints: the Gateway passes calls through (v1.0's way)",
    )
    parser.add_argument("--smoke", action="store_true", help="one harness (gsm8k), one rollout: that it runs")
    args = parser.parse_args(argv)
    harnesses = HARNESSES
    if args.smoke:
        harnesses, args.rollouts = [h for h in HARNESSES if h.example == "gsm8k"], 1
    if not EXAMPLES_PYTHON.exists():
        raise SystemExit(f"{EXAMPLES_PYTHON} is missing: run `make examples-venv` first")
    lines = [
        "| harness | model calls / rollout | rows / rollout, template-style tool JSON | first merge break | "
        "rows / rollout, compact tool JSON | first merge break (compact) |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="agl-merge-") as tmp:
        for i, harness in enumerate(harnesses):
            exact = not args.pass_through
            canonical = measure(harness, False, args.rollouts, Path(tmp) / f"{i}-canonical", exact)
            compact = measure(harness, True, args.rollouts, Path(tmp) / f"{i}-compact", exact)
            print(
                f"{harness.label}: {canonical.calls:.2f} calls, {canonical.rows:.2f} / {compact.rows:.2f} rows, "
                f"reward {canonical.reward:.2f}, {canonical.seconds + compact.seconds:.0f} s",
                file=sys.stderr,
            )
            lines.append(
                f"| {harness.label} | {canonical.calls:.2f} | {canonical.rows:.2f} | {_cell(canonical.first_break)} "
                f"| {compact.rows:.2f} | {_cell(compact.first_break)} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
