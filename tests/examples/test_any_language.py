"""An agent in another language, run as a command (`config.local.command`): examples/any_language's
JavaScript agent (Node, no packages) through a real Gateway and Controller against the scripted
model — its tool loop recorded token for token as one row, its own reward posted; an agent command
that fails, or that is not there, gives a failed rollout that says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.examples.stack import EXAMPLES, example_stack
from tests.fakes.scripted_policies import expression_for, number_in, tool_then_answer
from tests.heavy import require

HERE = EXAMPLES / "any_language"
ENV_MAP = {"QUESTION": "input.question", "ANSWER": "input.answer"}
EXPRESSIONS = {"baker": "24 + 18 - 35", "Tom reads": "12 * 9 + 20 * 3"}


@pytest.fixture(scope="module")
def node() -> str:
    require([] if shutil.which("node") else ["node (Node.js >= 18)"])
    return "node"


def test_a_javascript_agent_trains_as_a_command(node: str, tmp_path: Path) -> None:
    tasks = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()][:2]
    right, wrong = tasks[0], {**tasks[1], "answer": 1}  # the second one scored against a wrong answer
    policy = tool_then_answer(
        "calculate", expression_for(EXPRESSIONS), lambda out: f"It is {number_in(out)}."
    )
    with example_stack(policy, "any_language", tmp_path) as stack:
        solved, missed = stack.run([node, "agent.mjs"], ENV_MAP, [right, wrong])
    for result in (solved, missed):
        assert result.state == "succeeded", (result.error, result.log[-2000:])
        calls = result.model_requests
        assert len(calls) == 2 and all(c["data"]["http_status"] == 200 for c in calls)
        assert all(c["data"]["response"]["choices"][0]["token_ids"] for c in calls)
        assert len(result.rows) == 1  # the tool loop is one training row
    assert solved.rewards == [1.0] and missed.rewards == [0.0]
    assert "expected 7: reward 1" in solved.log  # the agent's own output, in its log


def test_a_failing_or_missing_agent_command_fails_the_rollout_saying_why(node: str, tmp_path: Path) -> None:
    policy = tool_then_answer("calculate", expression_for(EXPRESSIONS), lambda out: out)
    with example_stack(policy, "any_language", tmp_path) as stack:
        (crashed,) = stack.run([node, "-e", "console.error('no tool server'); process.exit(3)"], {}, [{}])
        (missing,) = stack.run(["./no-such-agent"], {}, [{}])
    assert crashed.state == "failed"
    assert "agent exited with code 3" in (crashed.error or "") and "no tool server" in (crashed.error or "")
    assert missing.state == "failed"
    assert "cannot run the agent command './no-such-agent'" in (missing.error or "")


def test_agl_eval_runs_the_javascript_agent_as_a_command(
    node: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agl-eval` with `agent.command`: the same agent, on an endpoint (the scripted model)."""
    from agentlightning.evaluation.cli import main
    from tests.fakes.scripted_model import ScriptedChatModel

    data = tmp_path / "tasks.jsonl"
    tasks = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()][:2]
    data.write_text("".join(json.dumps({**t, "id": f"t{i}"}) + "\n" for i, t in enumerate(tasks)))
    policy = tool_then_answer(
        "calculate", expression_for(EXPRESSIONS), lambda out: f"It is {number_in(out)}."
    )
    out = tmp_path / "eval"
    with ScriptedChatModel(policy) as model:
        main(
            [f"data={data}", f"policies=[scripted={model.base_url}]", f"output_dir={out}", "plot=false",
             f"agent.command=[{node},agent.mjs]", "agent.agent_class=null", f"agent.cwd={HERE}"]
        )  # fmt: skip
    report = json.loads((out / "report.json").read_text())["policies"]["scripted"]
    assert [t["rewards"] for t in report["tasks"]] == [[1.0], [1.0]]
    assert report["calls_per_rollout"] == 2
