"""agl-eval against an OpenAI-compatible endpoint the user runs: the session's real vLLM server
(serving the scripted model), through the eval's own Gateway and Controller and the demo agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentlightning.evaluation.cli import main
from tests.vllm.conftest import ScriptedVLLM
from tests.vllm.scripted import QUESTION


def test_eval_of_a_running_vllm_endpoint(
    vllm_server: ScriptedVLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The scripted model always computes 24: right on the first task, wrong on the second.
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        json.dumps({"id": "right", "question": QUESTION, "answer": 24})
        + "\n"
        + json.dumps({"id": "wrong", "question": QUESTION, "answer": 25})
        + "\n"
    )
    out = tmp_path / "eval"
    main([f"data={data}", f"policies=[vllm={vllm_server.endpoint}]", f"output_dir={out}"])
    report = json.loads((out / "report.json").read_text())
    policy = report["policies"]["vllm"]
    assert policy["kind"] == "endpoint"
    assert [t["rewards"] for t in policy["tasks"]] == [[1.0], [0.0]]
    assert policy["calls_per_rollout"] == 3  # two tool calls, then the answer
    assert policy["completion_tokens_per_rollout"] > 0
    assert "| vllm | 0.500 [" in capsys.readouterr().out
