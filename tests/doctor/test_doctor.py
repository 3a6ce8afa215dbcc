"""`agl-doctor` gives each broken harness its diagnosis: small agents built to fail one check each
(`doctor_agents.py`), run through a real Gateway and Controller against the scripted
Qwen2.5-template model (real chat template and BPE tokenizer, vLLM's token endpoints)."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning.doctor.cli import main
from agentlightning.doctor.verdict import EXIT_BAD_INPUT, EXIT_CODES, NOT_TRAINABLE, TRAINABLE, WITH_BREAKS
from tests.examples.stack import EXAMPLES
from tests.fakes.scripted_model import PolicyBackend, ScriptedChatModel, encode, tool_call_text
from tests.heavy import require

HERE = Path(__file__).resolve().parent


def policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, compact: bool = False) -> str:
    """Call the calculator once, then answer from what it said (a tool result or a summary of it)."""
    said = [m["content"] for m in messages if m["role"] == "tool"]
    said += [
        m["content"].rsplit("said ", 1)[1].rstrip(".")
        for m in messages
        if "calculator said" in str(m["content"])
    ]
    if said:
        return f"ANSWER: {said[-1]}"
    return tool_call_text("calculate", {"expression": "6 * 7"}, compact=compact)


def compact_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return policy(messages, tools, compact=True)


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "What is 6 times 7?", "answer": "42"}) + "\n")
    return path


def doctor(
    tasks: Path, server: str, mode: str, *extra: str, env: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any]]:
    argv = [
        "--agent", "doctor_agents:DoctorAgent", "--cwd", str(HERE), "--tasks", str(tasks),
        "--env-map", "QUESTION=input.question", "--env-map", "ANSWER=input.answer",
        "--env", f"DOCTOR_MODE={mode}", *(a for e in env for a in ("--env", e)),
        "--server", server, "--rollouts", "1", "--timeout", "120", "--json", *extra,
    ]  # fmt: skip
    return main(argv), {}


def run(capsys: pytest.CaptureFixture[str], *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    code, _ = doctor(*args, **kwargs)
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == code
    return code, report


@pytest.fixture
def model() -> Iterator[ScriptedChatModel]:
    with ScriptedChatModel(policy, scale_out=True, streams=True) as server:
        yield server


def paths(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["path"]: p for p in report["paths"]}


@pytest.mark.process
def test_a_clean_tool_loop_is_trainable(
    capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel
) -> None:
    code, report = run(capsys, tasks, model.base_url, "loop")
    assert (code, report["verdict"]) == (EXIT_CODES[TRAINABLE], TRAINABLE), report["findings"]
    token, passed = paths(report)["token path"], paths(report)["pass-through"]
    assert token["token_exact_calls"] == token["total_calls"] == 2
    assert token["rows_per_rollout"]["max"] == passed["rows_per_rollout"]["max"] == 1
    assert token["features"] == ["tool calls", "tools"] and token["rewards"] == [1.0]
    checked = {(p["check"], p["ok"]) for p in report["probes"]}
    assert ("render", True) in checked and ("stream", True) in checked and ("render", False) not in checked


@pytest.mark.process
def test_tool_json_re_rendered_on_pass_through(capsys: pytest.CaptureFixture[str], tasks: Path) -> None:
    # The model writes compact tool-call JSON; the template re-renders it with spaces.
    with ScriptedChatModel(compact_policy, scale_out=True, streams=True) as model:
        code, report = run(capsys, tasks, model.base_url, "loop")
    token, passed = paths(report)["token path"], paths(report)["pass-through"]
    assert token["rows_per_rollout"]["max"] == 1 and passed["rows_per_rollout"]["max"] == 2
    assert [b["reason"] for b in passed["breaks"]] == ["rerendered"] and passed["breaks"][0]["call"] == 1
    assert (code, report["verdict"]) == (0, TRAINABLE)  # on the token path it is one row
    warned = [f for f in report["findings"] if "rerendered" in f["what"]]
    assert warned and warned[0]["severity"] == "warning" and "token_exact" in warned[0]["fix"]
    # and the token path's prompt is the model's own output, not the server's re-render:
    render = [p for p in report["probes"] if p["check"] == "render" and p["call"] == 1]
    assert render and render[0]["ok"] is False


@pytest.mark.process
def test_tool_json_re_rendered_without_token_endpoints_breaks(
    capsys: pytest.CaptureFixture[str], tasks: Path
) -> None:
    with ScriptedChatModel(compact_policy, scale_out=False, streams=True) as model:
        code, report = run(capsys, tasks, model.base_url, "loop")
    assert list(paths(report)) == ["pass-through"]
    assert (code, report["verdict"]) == (EXIT_CODES[WITH_BREAKS], WITH_BREAKS)
    (finding,) = [f for f in report["findings"] if f["severity"] == "break"]
    assert (
        "`rerendered`" in finding["what"]
        and "at token" in finding["what"]
        and "enable-scale-out" in finding["fix"]
    )


class DriftingStream(PolicyBackend):
    """A server whose streamed answer carries other ids than the same answer not streamed (a
    streaming tool-call parser that re-serializes what the model wrote)."""

    def stream_chunks(self, answer: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        chunks = super().stream_chunks(answer, include_usage)
        message = answer["choices"][0]["message"]
        if message["tool_calls"]:
            function = message["tool_calls"][0]["function"]
            compact = tool_call_text(function["name"], json.loads(function["arguments"]), compact=True)
            chunks[1]["choices"][0]["token_ids"] = [*encode(compact), answer["choices"][0]["token_ids"][-1]]
        return chunks


@pytest.mark.process
def test_a_stream_whose_ids_differ(capsys: pytest.CaptureFixture[str], tasks: Path) -> None:
    with ScriptedChatModel(policy, scale_out=False, streams=True) as model:
        model.backend.__class__ = DriftingStream
        code, report = run(capsys, tasks, model.base_url, "stream")
    assert "streaming" in paths(report)["pass-through"]["features"]
    (stream,) = [p for p in report["probes"] if p["check"] == "stream"]
    assert stream["ok"] is False and stream["note"] == "streamed answer ids differ"
    assert (code, report["verdict"]) == (EXIT_CODES[NOT_TRAINABLE], NOT_TRAINABLE)
    assert any(
        f["severity"] == "fatal" and "streamed answer differs" in f["what"] for f in report["findings"]
    )


@pytest.mark.process
def test_a_compaction_breaks_the_rollout(
    capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel
) -> None:
    code, report = run(capsys, tasks, model.base_url, "compact", "--paths", "token")
    token = paths(report)["token path"]
    assert token["rows_per_rollout"]["max"] == 2
    (brk,) = token["breaks"]
    assert brk["call"] == 1 and brk["reason"] == "history_shortened" and brk["index"] > 0
    assert (code, report["verdict"]) == (EXIT_CODES[WITH_BREAKS], WITH_BREAKS)
    (finding,) = [f for f in report["findings"] if f["severity"] == "break"]
    assert "compaction" in finding["fix"]


@pytest.mark.process
def test_no_reward(capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel) -> None:
    code, report = run(capsys, tasks, model.base_url, "no_reward", "--paths", "token")
    assert (code, report["verdict"]) == (EXIT_CODES[NOT_TRAINABLE], NOT_TRAINABLE)
    assert [f["what"] for f in report["findings"] if f["severity"] == "fatal"] == [
        "no rollout reported a reward"
    ]


@pytest.mark.process
def test_a_harness_that_crashes(
    capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel
) -> None:
    code, report = run(capsys, tasks, model.base_url, "crash", "--paths", "token")
    token = paths(report)["token path"]
    assert (token["succeeded"], token["total_calls"]) == (0, 1)
    assert "RuntimeError: the harness crashed after its first call" in token["failures"][0]
    assert (code, report["verdict"]) == (EXIT_CODES[NOT_TRAINABLE], NOT_TRAINABLE)
    (fatal,) = [f for f in report["findings"] if f["severity"] == "fatal"]
    assert fatal["what"].startswith("every rollout failed") and "harness crashed" in fatal["what"]


@pytest.mark.process
def test_calls_that_bypass_the_gateway(
    capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel
) -> None:
    code, report = run(
        capsys,
        tasks,
        model.base_url,
        "bypass",
        "--paths",
        "token",
        env=(f"DOCTOR_UPSTREAM={model.base_url}",),
    )
    token = paths(report)["token path"]
    assert token["total_calls"] == 0 and token["rewards"] == [1.0]  # it ran, and asked the model elsewhere
    assert (code, report["verdict"]) == (EXIT_CODES[NOT_TRAINABLE], NOT_TRAINABLE)
    assert any("no model call reached the Gateway" in f["what"] for f in report["findings"])


# --- bad input: a clear error, exit 2, before anything starts -----------------------------------


def test_an_agent_that_does_not_import(capsys: pytest.CaptureFixture[str], tasks: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "--agent",
                "no_such_module:Agent",
                "--cwd",
                str(HERE),
                "--tasks",
                str(tasks),
                "--server",
                "http://127.0.0.1:9/v1",
            ]
        )
    assert exited.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert (
        "agl-doctor: the agent 'no_such_module:Agent' does not load" in err
        and "No module named 'no_such_module'" in err
    )
    assert "Traceback" not in err


def test_a_server_that_does_not_answer(capsys: pytest.CaptureFixture[str], tasks: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(SystemExit) as exited:
            main(["--agent", "doctor_agents:DoctorAgent", "--cwd", str(HERE), "--tasks", str(tasks),
                  "--server", f"http://127.0.0.1:{port}/v1"])  # fmt: skip
    assert exited.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"the model server at http://127.0.0.1:{port}/v1 does not answer GET /models" in err
    assert "Traceback" not in err


def test_bad_tasks_and_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"question": 1}\n[1, 2]\n')
    for argv, said in [
        (["--tasks", str(bad)], f"--tasks {bad}, line 2: a task must be a JSON object, got list"),
        (["--tasks", str(tmp_path / "none.jsonl")], "No such file or directory"),
        (["--tasks", str(bad), "--rollouts", "0"], "--rollouts must be at least 1"),
        (["--tasks", str(bad), "--server", "http://x/v1", "--model", "m"], "with --server it does nothing"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(["--agent", "doctor_agents:DoctorAgent", "--cwd", str(HERE), *argv])
        assert exited.value.code == EXIT_BAD_INPUT
        assert said in capsys.readouterr().err


@pytest.mark.process
def test_the_built_in_engine_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # No --server: the doctor starts the built-in torch engine (the demo's tiny random model); it
    # serves no token endpoints, so one pass-through run, said so.
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"question": "Ann has 9 books and gives away three. How many?", "answer": 6}) + "\n"
    )
    code = main(
        ["--agent", "agentlightning.demo.agent:CalcAgent", "--tasks", str(tasks), "--rollouts", "1",
         "--env-map", "QUESTION=input.question", "--env-map", "ANSWER=input.answer", "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["server"] == "built-in torch engine (demo)" and list(paths(report)) == ["pass-through"]
    assert any("does not serve vLLM's token endpoints" in n for n in report["notes"])
    passed = paths(report)["pass-through"]
    assert passed["total_calls"] >= 1 and passed["rewards"] and passed["token_exact_calls"] == 0
    regenerated = [p for p in report["probes"] if p["check"] == "regenerate"]
    assert regenerated and all(p["ok"] for p in regenerated)  # greedy on the engine reproduces its answers
    assert code == report["exit_code"] == EXIT_CODES[report["verdict"]]


# --- the judgement on recorded events, without processes ------------------------------------------


def _call(
    prompt: list[int], answer: list[int], segment: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A recorded chat call: (raw event, triplet event)."""
    response = {
        "prompt_token_ids": prompt,
        "choices": [
            {"token_ids": answer, "message": {"role": "assistant", "content": "x", "tool_calls": []}}
        ],
    }
    raw = {
        "event_type": "model_request",
        "data": {
            "api": "chat.completions",
            "request": {"stream": True, "messages": []},
            "response": response,
            "segment": segment,
        },
    }
    triplet = {
        "event_type": "model_request",
        "data": {"prompt_token_ids": prompt, "response_token_ids": answer},
    }
    return raw, triplet


def test_judgement_of_a_compacted_rollout_without_processes() -> None:
    from agentlightning.doctor.analysis import TOKEN_PATH, RecordedRollout, analyze
    from agentlightning.doctor.verdict import HarnessReport, judge, markdown

    first = _call([1, 2, 3], [4, 5], {"first": True})
    # The second call's prompt does not start with the first's prompt + answer: a compaction at token 1.
    second = _call([1, 9], [6], {"continues": False, "break": {"reason": "history_shortened", "index": 1}})
    reward = {"event_type": "reward", "data": {"value": 0.5}}
    rollout = RecordedRollout("r1", "succeeded", None, [first[0], second[0], reward], [first[1], second[1]])
    path = analyze(TOKEN_PATH, [rollout])
    assert (path.total_calls, path.rows_per_rollout and path.rows_per_rollout.max) == (2, 2)
    assert [(b.call, b.reason, b.index) for b in path.breaks] == [(1, "history_shortened", 1)]
    assert path.features == ["streaming"] and path.rewards == [0.5] and path.token_exact_calls == 2
    report = judge(HarnessReport("h", "s", [path], []))
    assert (report.verdict, report.exit_code) == (WITH_BREAKS, 1)
    text = markdown(report)
    assert "## h: **trainable with breaks**" in text and "call 1: history_shortened @ 1" in text
    assert "call 1 of r1 at token 1" in text and "compaction" in text


@pytest.mark.process
def test_an_agent_in_another_language_given_as_a_command(
    capsys: pytest.CaptureFixture[str], tasks: Path, model: ScriptedChatModel
) -> None:
    """examples/any_language's JavaScript agent, as `--command`: checked as a class agent is."""
    require([] if shutil.which("node") else ["node (Node.js >= 18)"])
    code = main(
        ["--command", "node agent.mjs", "--cwd", str(EXAMPLES / "any_language"), "--tasks", str(tasks),
         "--env-map", "QUESTION=input.question", "--env-map", "ANSWER=input.answer",
         "--server", model.base_url, "--rollouts", "1", "--timeout", "120", "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert (code, report["verdict"]) == (EXIT_CODES[TRAINABLE], TRAINABLE), report["findings"]
    assert report["harness"] == "node agent.mjs"
    token = paths(report)["token path"]
    assert token["token_exact_calls"] == 2 and token["rewards"] == [1.0]


def test_a_command_that_is_not_there_or_not_one(capsys: pytest.CaptureFixture[str], tasks: Path) -> None:
    for argv, said in [
        (
            ["--command", "no-such-program --flag"],
            "--command: 'no-such-program' is not a program it can run (on PATH)",
        ),
        (
            ["--command", "./agent.js", "--cwd", str(HERE)],
            f"'./agent.js' is not a program it can run (in {HERE})",
        ),
        (["--command", "node 'agent.mjs"], "--command: No closing quotation"),
        (["--command", "   "], "--command is empty"),
        (["--command", "node a.mjs", "--python", sys.executable], "a --command names its own"),
        (["--command", "node a.mjs", "--agent", "m:C"], "not allowed with argument"),
    ]:
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--tasks", str(tasks), "--server", "http://127.0.0.1:9/v1"])
        assert exited.value.code == EXIT_BAD_INPUT
        assert said in capsys.readouterr().err
