"""examples/swe/tiny_policy.py: the naive agent's demonstrations solve or fail their tasks as labelled,
the short prompts reach mini-swe-agent through its own config merge and render as the warm-up renders
them, and the warm-up's token ids are those the Gateway will see (each call's prompt extends the
previous call's prompt and response)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from agentlightning.tiny_model import bpe_json, tokenizer_from_json
from examples.swe.grader import grade
from examples.swe.mini_agent import prompt_specs
from examples.swe.tasks import checkout
from examples.swe.tiny_policy import (
    BASH_TOOL,
    SUBMIT,
    as_text,
    commands,
    conversation,
    edit_of,
    family_tasks,
    opening,
    render,
    run_command,
)
from tests.examples.swe_engineer import SWE_PYTHON
from tests.heavy import require

TASKS = family_tasks(0)
ONE_EACH = {edit_of(t).function: t for t in reversed(TASKS)}  # one task per buggy function


def _edited_module(task, edit: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ws = checkout(task, Path(tmp) / "ws")
        for command in commands(task, edit)[:2]:
            assert run_command(ws, command)["returncode"] == 0, command
        return (ws / edit_of(task).path).read_text()


def _fixed_module(task) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ws = checkout(task, Path(tmp) / "ws")
        subprocess.run(["patch", "-p1", "-s"], input=task.patch, text=True, cwd=ws, check=True)
        return (ws / edit_of(task).path).read_text()


def test_the_family_has_five_bugs_two_of_which_the_naive_edit_fixes() -> None:
    assert sorted(ONE_EACH) == ["clamp", "days_in_month", "is_prime", "running_max", "truncate"]
    naive_right = sorted(f for f, t in ONE_EACH.items() if edit_of(t).naive == edit_of(t).right)
    assert naive_right == ["is_prime", "truncate"]


@pytest.mark.parametrize("function", ["clamp", "days_in_month", "is_prime", "running_max", "truncate"])
def test_the_right_edit_is_the_reference_fix_and_the_naive_one_is_not_unless_labelled(function: str) -> None:
    task = ONE_EACH[function]
    e = edit_of(task)
    assert _edited_module(task, e.right) == _fixed_module(task)
    assert (_edited_module(task, e.naive) == _fixed_module(task)) == (e.naive == e.right)


def test_the_grader_agrees_with_the_labels() -> None:
    """Right edit -> reward 1; the naive edit where it is wrong -> 0 (the hidden tests decide)."""
    task = ONE_EACH["clamp"]
    e = edit_of(task)
    for edit, reward in ((e.right, 1.0), (e.naive, 0.0)):
        with tempfile.TemporaryDirectory() as tmp:
            ws = checkout(task, Path(tmp) / "ws")
            for command in commands(task, edit)[:2]:
                run_command(ws, command)
            assert grade(task, ws, timeout=60, sandbox=False).reward == reward, edit


def test_short_prompts_reach_mini_and_render_as_the_warm_up_renders_them(tmp_path: Path) -> None:
    """mini-swe-agent's own config loading merges prompts/short.yaml over mini.yaml (the `-c` specs
    mini_agent passes) and its template rendering gives the messages the demonstrations start with."""
    require([] if SWE_PYTHON.exists() else [".venv-swe (make swe-venv)"])
    task = TASKS[0]
    script = """
import json, sys
from jinja2 import StrictUndefined, Template
from minisweagent.config import get_config_from_spec
from minisweagent.utils.serialize import recursive_merge
specs, task = json.loads(sys.argv[1]), sys.argv[2]
agent = recursive_merge(*[get_config_from_spec(s) for s in specs])["agent"]
uname = dict(system="Linux", release="r", version="v", machine="m")  # what mini.yaml also names
render = lambda t: Template(t, undefined=StrictUndefined).render(task=task, **uname)
print(json.dumps([render(agent["system_template"]), render(agent["instance_template"])]))
"""
    for choice, short in ((None, False), ("short", True)):
        done = subprocess.run(
            [str(SWE_PYTHON), "-c", script, json.dumps(prompt_specs(choice)), task.problem_statement],
            capture_output=True,
            text=True,
            check=True,
            env={
                "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path),
                "MSWEA_CONFIGURED": "true",
                "PATH": os.environ["PATH"],
            },
        )
        system, instance = json.loads(done.stdout.splitlines()[-1])  # after mini's banner
        ours = [m["content"] for m in opening(task)]
        assert ([system, instance] == ours) is short
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in instance  # both tell the submit command
    with pytest.raises(SystemExit, match="no such prompts file"):
        prompt_specs("nonexistent")


def test_warm_up_ids_extend_call_by_call_with_a_trained_tokenizer() -> None:
    task = ONE_EACH["running_max"]
    e = edit_of(task)
    messages = conversation(task, e.naive)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    commands_sent = [
        json.loads(m["tool_calls"][0]["function"]["arguments"])["command"] for m in messages[2::2]
    ]
    assert commands_sent == [*commands(task, e.naive)[:2], SUBMIT]
    assert f"def {e.function}" in messages[3]["content"] and e.buggy in messages[3]["content"]
    texts = [as_text(conversation(t, edit_of(t).right)) for t in TASKS[:12]]
    tokenizer = tokenizer_from_json(bpe_json(texts, 600))
    ids, mask = render(tokenizer, messages)
    # What the Gateway tokenizes at the last call: the whole prompt, rendered by the template.
    last_prompt = tokenizer.apply_chat_template(
        messages[:-1], tools=[BASH_TOOL], add_generation_prompt=True, tokenize=True
    )
    if hasattr(last_prompt, "keys"):  # a BatchEncoding in newer transformers
        last_prompt = last_prompt["input_ids"]
    model_turns = [k for k, m in enumerate(mask) if m]
    assert ids[: len(last_prompt)] == list(last_prompt)
    assert (
        tokenizer.decode(ids[len(last_prompt) :], skip_special_tokens=True)
        == f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{SUBMIT}"}}}}\n</tool_call>'
    )
    assert model_turns and all(mask[k] for k in range(len(last_prompt), len(ids)))
