"""LLM-in-Sandbox: the sandbox's limits with the real bubblewrap (no network, no writes outside the
workspace), the task families and rewards, and the agent end to end — started by a real
Controller for rollouts on a real Gateway, against the scripted model, its tools run for real in
the sandbox: a right answer per family (reward 1), a wrong one (reward 0), and an escape attempt
(network, writes outside) that fails and still finishes its task; and the converter of public data
(its rows, its errors, one converted row solved end to end)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.examples.stack import (
    EXAMPLES,
    RolloutResult,
    Stack,
    example_stack,
)
from tests.fakes.scripted_model import tool_call_text

HERE = EXAMPLES / "llm_in_sandbox"
AGENT = "sandbox_agent:SandboxAgent"
ENV_MAP = {
    "TASK_FAMILY": "input.family",
    "TASK_SEED": "input.seed",
    "QUESTION": "input.question",
    "ANSWER": "input.answer",
    "TASK_DOCUMENTS": "input.documents",
}


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(HERE))  # the agent imports `tasks` as its Controller's cwd makes it
    try:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HERE))


tasks = _load("tasks")


@pytest.fixture(scope="module")
def bwrap() -> None:
    from agentlightning.sandbox import available

    if not available():
        reason = "bubblewrap is not usable here (apt-get install -y bubblewrap)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required on CI)")
        pytest.skip(reason)


# --- the task families -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_tasks_are_deterministic_and_their_files_hold_the_answer(family: str, tmp_path: Path) -> None:
    task = tasks.make_task(family, 3)
    assert task == tasks.make_task(family, 3) and task != tasks.make_task(family, 4)
    tasks.materialize(family, 3, tmp_path)
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    if family == "long_context":
        (log,) = files.values()
        assert len(log.splitlines()) == 4000 and log.count(task["answer"]) == 1
        assert task["answer"] not in task["question"]
    elif family == "data":
        assert list(files) == ["sales.csv"] and len(files["sales.csv"].splitlines()) == 401
    else:
        assert files == {}
    assert tasks.reward(family, task["answer"], task["answer"]) == 1.0
    assert tasks.reward(family, None, task["answer"]) == 0.0
    assert tasks.reward(family, "wrong", task["answer"]) == 0.0


def test_rewards_per_family() -> None:
    assert tasks.reward("math", " 1,234 ", "1234") == 1.0
    assert tasks.reward("math", "1234.0", "1234") == 0.0  # an integer, exactly
    assert tasks.reward("long_context", "`AB3`", "AB3") == 1.0
    assert tasks.reward("long_context", "ab3", "AB3") == 0.0  # codes are case-sensitive
    assert tasks.reward("data", "1,000.004", "1000.00") == 1.0
    assert tasks.reward("data", "1000.01", "1000.00") == 0.0
    assert tasks.reward("data", "East", "east") == 1.0
    with pytest.raises(ValueError, match="unknown task family"):
        tasks.make_task("chess", 1)


def test_shipped_data_is_what_tasks_py_writes() -> None:
    rows = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 96 and {r["family"] for r in rows} == set(tasks.FAMILIES)
    for row in rows[:6]:
        assert row == tasks.make_task(row["family"], row["seed"])


# --- the public-data converter ---------------------------------------------------------------------

# Hand-written rows in the shapes public sets come in (nothing downloaded): math-style with an
# integer answer, a short-answer question, and a question whose answer is in its documents.
CONVERT = [sys.executable, "-m", "examples.llm_in_sandbox.convert"]
KESTREL = "In what year was the observatory at Kestrel Point founded?"
PUBLIC_ROWS = [
    {"id": "aime-1", "question": "How many positive divisors does 7!*8 have?", "answer": "1,234"},
    {"question": "What is the chemical symbol of sodium?", "answer": "Na"},
    {
        "id": "kestrel",
        "question": KESTREL,
        "answer": 1887,
        "documents": {
            "history.txt": "Notes on the coast.\nThe observatory at Kestrel Point was founded in 1887 by a guild.\n",
            "tides.txt": "High water at 06:12 and 18:40.\n",
        },
    },
    {
        "id": "trial",
        "question": "Which enzyme is named in the abstract?",
        "answer": "lactase",
        "documents": ["x"],
    },
]


def convert_public_rows(tmp: Path, rows: list[Any] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the converter's command line on `rows` (as JSONL; strings as raw lines)."""
    source, out = tmp / "public.jsonl", tmp / "tasks.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in (PUBLIC_ROWS if rows is None else rows)]
    source.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [*CONVERT, str(source), str(out), "--documents", str(tmp / "documents")],
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, out


def test_the_converter_writes_task_rows_by_family(tmp_path: Path) -> None:
    result, out = convert_public_rows(tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["family"], r["answer"]) for r in rows] == [
        ("aime-1", "math", "1234"),
        ("row-2", "qa", "Na"),
        ("kestrel", "documents", "1887"),
        ("trial", "documents", "lactase"),
    ]
    assert rows[0]["documents"] == rows[1]["documents"] == ""
    assert rows[2]["question"].startswith(KESTREL) and "history.txt, tides.txt" in rows[2]["question"]
    folder = Path(rows[2]["documents"])
    assert folder == (tmp_path / "documents" / "kestrel").resolve()
    assert sorted(p.name for p in folder.iterdir()) == ["history.txt", "tides.txt"]
    assert [p.name for p in Path(rows[3]["documents"]).iterdir()] == ["doc_1.txt"]
    # the rows are what the agent reads: materialize copies the files, reward applies the family's rule
    workspace = tmp_path / "ws"
    workspace.mkdir()
    tasks.materialize("documents", 0, workspace, rows[2]["documents"])
    assert (workspace / "history.txt").read_text() == (folder / "history.txt").read_text()
    assert tasks.reward("documents", "1887", rows[2]["answer"]) == 1.0
    assert tasks.reward("documents", "1887.0", rows[2]["answer"]) == 1.0  # numbers as numbers
    assert tasks.reward("documents", "1886", rows[2]["answer"]) == 0.0
    assert tasks.reward("qa", " na. ", "Na") == 1.0 and tasks.reward("qa", "Cl", "Na") == 0.0
    assert tasks.reward("qa", "the Na", "Na") == 1.0 and tasks.reward("qa", "", "Na") == 0.0
    assert tasks.reward("math", "1234", rows[0]["answer"]) == 1.0
    with pytest.raises(ValueError, match="documents folder"):
        tasks.materialize("documents", 0, workspace, str(tmp_path / "missing"))


def test_the_converter_names_each_bad_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = [
        PUBLIC_ROWS[0],
        "{not json",
        ["a", "list"],
        {"answer": "4"},
        {"question": "What?", "answer": None},
        {"question": "What?"},
        {"id": "../up", "question": "What?", "answer": "4"},
        {"id": "aime-1", "question": "Again?", "answer": "4"},
        {"id": "d", "question": "What?", "answer": "4", "documents": {"../x.txt": "text"}},
        {"id": "e", "question": "What?", "answer": "4", "documents": [1, 2]},
    ]
    result, out = convert_public_rows(tmp_path, bad)
    assert result.returncode == 1 and not out.exists() and not (tmp_path / "documents").exists()
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if ": line " in line]
    assert [e.split(": line ")[1].split(":")[0] for e in errors] == [str(n) for n in range(2, 11)]
    for expected in (
        "line 2: not JSON",
        "line 3: expected a JSON object, got list",
        "line 4: no 'question' text",
        "line 5: 'answer' must be a text or a number, not NoneType",
        "line 6: no 'answer'",
        "line 7: id '../up'",
        "line 8: id 'aime-1' already on line 1",
        "line 9: document name '../x.txt'",
        "line 10: 'documents' as a list must hold texts",
    ):
        assert expected in result.stderr, (expected, result.stderr)
    assert "9 bad line(s); nothing written" in result.stderr
    # documents without a folder for them
    source = tmp_path / "one.jsonl"
    source.write_text(json.dumps(PUBLIC_ROWS[2]) + "\n")
    missing = subprocess.run(
        [*CONVERT, str(source), str(tmp_path / "o.jsonl")],
        cwd=EXAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "line 1: has documents: pass --documents DIR" in missing.stderr


# --- the sandbox, through the agent's own tools ----------------------------------------------------


@pytest.fixture()
def tools(tmp_path: Path, bwrap: None) -> Any:
    sys.path.insert(0, str(HERE))
    try:
        agent = _load("sandbox_agent")
    finally:
        sys.path.remove(str(HERE))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return agent.Tools(workspace, timeout=20, output_chars=4000)


def test_tools_work_in_the_workspace(tools: Any) -> None:
    assert "wrote 6 bytes to notes.txt" in tools.write_file("notes.txt", "hello\n")
    assert (tools.box.workspace / "notes.txt").read_text() == "hello\n"
    assert tools.read_file("notes.txt").endswith("hello\n")
    assert "[exit 0]\n/workspace\n" == tools.shell("pwd")
    assert "[exit 0]\n4\n" == tools.python("print(2 + 2)")
    assert "[exit 3]" in tools.shell("exit 3")
    assert tools.call("python", '{"code": 1}').startswith("error: bad arguments for python")
    assert tools.call("read_file", '{"path": "notes.txt", "start": "x"}').startswith("error: bad arguments")
    assert tools.call("rm_rf", "{}").startswith("error: no tool 'rm_rf'")
    assert tools.call("shell", "not json").startswith("error: bad arguments for shell")


def test_the_sandbox_has_no_network(tools: Any) -> None:
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # a server on the host's loopback
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53), ('pypi.org', 443)):\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=3)\n"
            "        print('CONNECTED', host)\n"
            "    except OSError as exc:\n"
            "        print('refused', host, type(exc).__name__)\n"
        )
        out = tools.python(code)
    finally:
        listener.close()
    assert "CONNECTED" not in out and out.count("refused") == 3, out
    assert "bytes" not in tools.shell("cat /sys/class/net/*/address 2>/dev/null; ls /sys/class/net 2>&1")


def test_the_sandbox_writes_only_in_its_workspace(tools: Any, tmp_path: Path) -> None:
    name = f"escape-{uuid.uuid4().hex}"
    outside = tmp_path / name  # next to the workspace on the host
    out = tools.shell(
        f"echo x > /usr/{name}; echo x > /etc/{name}; echo x > /tmp/{name}; echo x > {outside}; "
        f"echo x > ../{name}; echo x > $HOME/{name}; ls /workspace/.. ; echo done"
    )
    assert "Read-only file system" in out and "done" in out
    tools.write_file(f"/etc/{name}", "x")  # the sandbox's own /etc (a tmpfs): gone with it
    for path in (Path("/usr") / name, Path("/etc") / name, Path("/tmp") / name, outside, Path.home() / name):
        assert not path.exists(), path
    assert sorted(p.name for p in tools.box.workspace.iterdir()) == []
    assert "Read-only file system" in tools.write_file(f"/usr/{name}", "x")


def test_a_command_past_its_time_limit_is_killed(tmp_path: Path, bwrap: None) -> None:
    agent = sys.modules.get("sandbox_agent") or _load("sandbox_agent")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    slow = agent.Tools(workspace, timeout=1, output_chars=4000)
    assert slow.shell("sleep 30 & sleep 30; echo never").startswith("[timed out]")


def test_the_environment_does_not_reach_the_sandbox(tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSWER", "the-secret-answer")
    monkeypatch.setenv("AGL_KEY", "the-secret-key")
    out = tools.shell("env; cat /proc/1/environ 2>/dev/null; cat /proc/$PPID/environ 2>/dev/null; echo end")
    assert "the-secret" not in out and "end" in out


# --- end to end through the Gateway -------------------------------------------------------------


def _code_for(question: str) -> tuple[str, dict[str, str]]:
    """The tool call a capable model would make for this question: (tool, arguments)."""
    if m := re.search(r"sum of all prime numbers below (\d+)", question):
        n = int(m.group(1))
        code = (
            f"n = {n}\ns = bytearray([1]) * n\ns[:2] = b'\\x00\\x00'\nfor i in range(2, int(n ** 0.5) + 1):\n"
        )
        code += "    if s[i]:\n        s[i*i::i] = bytearray(len(s[i*i::i]))\nprint(sum(i for i in range(n) if s[i]))"
        return "python", {"code": code}
    if m := re.search(r"What is (\d+) raised to the power (\d+), modulo (\d+)", question):
        return "python", {"code": f"print(pow({m.group(1)}, {m.group(2)}, {m.group(3)}))"}
    if m := re.search(r"from 1 to (\d+) are divisible by exactly one of (\d+) and (\d+)", question):
        last, p, q = m.groups()
        return "python", {
            "code": f"print(sum(1 for i in range(1, {last} + 1) if (i % {p} == 0) != (i % {q} == 0)))"
        }
    if m := re.search(r"access code of vault (\w+)", question):
        return "shell", {
            "command": f"grep -o 'vault={m.group(1)} access_code=[A-Z0-9]*' records.log | cut -d= -f3"
        }
    if m := re.search(r"revenue .* of product (\w+) in region (\w+)", question):
        code = (
            "import csv\nrows = list(csv.DictReader(open('sales.csv')))\n"
            f"print(f\"{{sum(int(r['units']) * float(r['unit_price']) for r in rows "
            f"if r['product'] == '{m.group(1)}' and r['region'] == '{m.group(2)}'):.2f}}\")"
        )
        return "python", {"code": code}
    if m := re.search(r"most units of product (\w+)", question):
        code = (
            "import csv, collections\nunits = collections.Counter()\n"
            f"for r in csv.DictReader(open('sales.csv')):\n    if r['product'] == '{m.group(1)}':\n"
            "        units[r['region']] += int(r['units'])\n"
            "print(max(units, key=lambda k: (units[k], k)))"
        )
        return "python", {"code": code}
    if question.startswith(KESTREL):  # a converted row: the answer is in its documents
        return "shell", {"command": "grep -ho 'founded in [0-9]*' *.txt | cut -d' ' -f3"}
    raise KeyError(question)


class SandboxPolicy:
    """Right: one tool call that computes the answer, then submit its last output line. `wrong`:
    submit 42 at once. `escape`: first try the network and writes outside, then solve it."""

    def __init__(self, wrong: str, escape: str, gateway_port: int, marker: str) -> None:
        self.wrong, self.escape, self.gateway_port, self.marker = wrong, escape, gateway_port, marker

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if question == self.wrong:
            return tool_call_text("submit", {"answer": "42"})
        if question == self.escape and len(results) == 0:
            code = (
                "import socket\ntry:\n"
                f"    socket.create_connection(('127.0.0.1', {self.gateway_port}), timeout=3)\n"
                "    print('CONNECTED')\nexcept OSError as exc:\n    print('network refused:', exc)"
            )
            return tool_call_text("python", {"code": code})
        if question == self.escape and len(results) == 1:
            name = f"escape-{self.marker}"
            return tool_call_text(
                "shell", {"command": f"echo x > /usr/{name}; echo x > /tmp/{name}; echo done"}
            )
        if len(results) == (2 if question == self.escape else 0):
            tool, arguments = _code_for(question)
            # Prose before the call (here for the revenue task only): vLLM's hermes parser keeps
            # "text\n" as content and the template renders it "\n" + content + "\n<tool_call>".
            preface = "Let me compute it.\n" if "revenue" in question else ""
            return preface + tool_call_text(tool, arguments)
        answer = results[-1].strip().splitlines()[-1]
        return tool_call_text("submit", {"answer": answer})


@pytest.fixture(scope="module")
def ran(
    tmp_path_factory: pytest.TempPathFactory, examples_python: str, bwrap: None
) -> Iterator[tuple[Stack, list[dict[str, Any]], list[RolloutResult], str]]:
    rows = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()]
    by_family = {f: [r for r in rows if r["family"] == f] for f in tasks.FAMILIES}
    data_rows = by_family["data"]
    revenue = next(r for r in data_rows if "revenue" in r["question"])
    region = next(r for r in data_rows if "most units" in r["question"])
    inputs = [
        by_family["math"][0],
        by_family["long_context"][0],
        revenue,
        region,
        by_family["math"][1],
        by_family["math"][2],
    ]
    marker = uuid.uuid4().hex
    work = tmp_path_factory.mktemp("llm_in_sandbox")
    converted, out = convert_public_rows(work)  # one converted row: its answer is in its documents
    assert converted.returncode == 0, converted.stderr
    inputs.append(
        next(r for line in out.read_text().splitlines() if (r := json.loads(line))["id"] == "kestrel")
    )
    policy = SandboxPolicy(inputs[4]["question"], inputs[5]["question"], 0, marker)
    with example_stack(policy, "llm_in_sandbox", work, maximum_size=3) as stack:
        policy.gateway_port = int(urlparse(stack.url).port or 0)
        results = stack.run(AGENT, ENV_MAP, inputs, timeout=300)
        yield stack, inputs, results, marker


@pytest.mark.process
def test_rewards_per_family_right_and_wrong(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult], str],
) -> None:
    _, _, results, _ = ran
    for result in results:
        assert result.state == "succeeded", f"{result.error}\n{result.log}"
    assert [r.rewards for r in results] == [[1.0], [1.0], [1.0], [1.0], [0.0], [1.0], [1.0]], [
        r.log for r in results
    ]


@pytest.mark.process
def test_tools_ran_in_the_sandbox_and_every_call_has_token_ids(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult], str],
) -> None:
    _, inputs, results, _ = ran
    needle = results[1]
    calls = [c["data"] for c in needle.model_requests]
    assert len(calls) == 2  # grep, submit
    tool_messages = [m for m in calls[1]["request"]["messages"] if m["role"] == "tool"]
    assert (
        tool_messages[0]["content"] == f"[exit 0]\n{inputs[1]['answer']}\n"
    )  # grep found it in the real file
    assert "sandbox_commands=1" in needle.log
    for result in results:
        for call in result.model_requests:
            response = call["data"]["response"]
            assert response["prompt_token_ids"] and response["choices"][0]["token_ids"]
            assert response["choices"][0]["logprobs"]["content"]
    for n, result in enumerate(results):
        if n == 2:  # the revenue task: text before the tool call re-renders with one more newline
            assert "re-renders an earlier model turn" in (result.merge_break() or "")
            assert len(result.rows) == 2
        else:
            assert result.merge_break() is None, result.merge_break()
            assert len(result.rows) == 1
    converted = results[6]  # grep found the year in the converted row's documents
    assert [len(r.model_requests) for r in results[6:]] == [2]
    tool_messages = [
        m for m in converted.model_requests[1]["data"]["request"]["messages"] if m["role"] == "tool"
    ]
    assert tool_messages[0]["content"] == "[exit 0]\n1887\n"
    assert len(results[4].model_requests) == 1  # the wrong one submitted at once
    assert "sandbox_commands=0" in results[4].log


@pytest.mark.process
def test_the_escape_attempt_fails_and_the_task_still_counts(
    ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult], str],
) -> None:
    _, _, results, marker = ran
    escape = results[5]
    outputs = [
        m["content"] for m in escape.model_requests[-1]["data"]["request"]["messages"] if m["role"] == "tool"
    ]
    assert "network refused" in outputs[0] and "CONNECTED" not in outputs[0]
    assert "Read-only file system" in outputs[1] and "done" in outputs[1]
    assert not Path(f"/usr/escape-{marker}").exists() and not Path(f"/tmp/escape-{marker}").exists()
    assert escape.rewards == [1.0]


@pytest.mark.process
def test_workspaces_are_removed(ran: tuple[Stack, list[dict[str, Any]], list[RolloutResult], str]) -> None:
    workspaces = [m.group(1) for r in ran[2] if (m := re.search(r"workspace=(\S+)", r.log))]
    assert len(workspaces) == len(ran[2])
    assert [w for w in workspaces if Path(w).exists()] == []


def test_run_local_refuses_pod_mode(tmp_path: Path, examples_python: str, bwrap: None) -> None:
    env = {
        **os.environ,
        "SANDBOX_ISOLATION": "pod",  # the model's commands without bubblewrap: for a Job's pod only
        "PYTHON": sys.executable,
        "AGENT_PYTHON": examples_python,
        "RUN_DIR": str(tmp_path / "run"),
    }
    result = subprocess.run(
        ["bash", "run_local.sh", "--train-file", "data/train.jsonl"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "SANDBOX_ISOLATION=pod is for Kubernetes Jobs only" in result.stderr
    assert not (tmp_path / "run" / "gateway.log").exists()  # nothing was started
