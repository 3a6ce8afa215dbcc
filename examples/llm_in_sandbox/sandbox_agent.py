"""LLM-in-Sandbox: a general agent that works in a sandbox with file, shell and Python tools
(Cheng et al., 2026), on the plain `openai` client with tool calls.

Each rollout gets a fresh workspace with the task's files (`tasks.materialize`). Every tool runs
*inside* a bubblewrap sandbox (`agentlightning.sandbox`): the workspace read-write at
`/workspace`, the system read-only, a private /tmp, no network (not even the host's loopback),
its own PID namespace, only PATH/HOME/LANG in the environment, a time limit per command. The
reference answer stays in this process, outside the sandbox; the reward is the task family's
rule (`tasks.reward`) applied to what the model `submit`s.

Environment (set by the Controller): `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`, and the
task — env_map `TASK_FAMILY: input.family`, `TASK_SEED: input.seed`, `QUESTION: input.question`,
`ANSWER: input.answer`, `TASK_DOCUMENTS: input.documents` (a folder whose files a converted row's
task reads, `""` for generated tasks). Knobs (the Controller's environment): `SANDBOX_MAX_TURNS`
(12), `SANDBOX_MAX_TOKENS` (1024 per call), `SANDBOX_COMMAND_TIMEOUT` (30 s),
`SANDBOX_OUTPUT_CHARS` (4000: longer tool output is cut, head and tail kept).

`SANDBOX_ISOLATION=pod` (set by job-template.yaml, never on a shared machine): the rollout's
Kubernetes pod is the sandbox (no bubblewrap in the container). The tools then run as plain child
processes in `SANDBOX_WORKSPACE` (the pod's emptyDir) with the same cleared environment, and this
process makes itself non-dumpable first, so that the model's commands (the same user) cannot read
its `/proc/<pid>/environ`, memory or file descriptors; the network is the pod's, which the
NetworkPolicy limits to the Gateway and DNS.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import tasks
from openai import BadRequestError, OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentlightning.agent_events import post_reward
from agentlightning.sandbox import Sandbox, SandboxResult, kill

log = logging.getLogger("llm_in_sandbox.agent")

SYSTEM = (
    "You are an agent working in a Linux sandbox. Your workspace is /workspace (the current directory); "
    "it holds the task's files. There is no network. Use the tools to inspect files, run shell commands "
    "and run Python 3 code; compute answers, do not guess. When you know the answer, call submit with "
    "just the answer."
)


def _function(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> ChatCompletionToolParam:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS = [
    _function("shell", "Run a bash command in /workspace.", {"command": {"type": "string"}}, ["command"]),
    _function(
        "python", "Run a Python 3 program; prints what it prints.", {"code": {"type": "string"}}, ["code"]
    ),
    _function(
        "read_file",
        "Read lines of a text file.",
        {"path": {"type": "string"}, "start": {"type": "integer"}, "lines": {"type": "integer"}},
        ["path"],
    ),
    _function(
        "write_file",
        "Create or overwrite a text file.",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _function(
        "submit", "Submit the final answer; ends the task.", {"answer": {"type": "string"}}, ["answer"]
    ),
]


def setting(name: str, default: float) -> float:
    raw = os.environ.get(name) or ""
    try:
        return float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: expected a number") from None


ISOLATIONS = ("bwrap", "pod")
# The whole environment of a tool command in either mode: nothing of the agent's (AGL_KEY, ANSWER).
COMMAND_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
PR_SET_DUMPABLE = 4


def isolation() -> str:
    """`SANDBOX_ISOLATION`: `bwrap` (default: each command in bubblewrap) or `pod` (the pod is the sandbox)."""
    value = os.environ.get("SANDBOX_ISOLATION") or "bwrap"
    if value not in ISOLATIONS:
        raise SystemExit(f"SANDBOX_ISOLATION={value!r}: expected one of {', '.join(ISOLATIONS)}")
    return value


def hide_this_process() -> None:
    """Make this process non-dumpable: its /proc/<pid>/environ, mem and fd then belong to root, and
    a command of the same user (the model's, in pod mode) can neither read nor ptrace it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def pod_workspace() -> Path:
    """pod mode: `SANDBOX_WORKSPACE`, an existing empty folder (the pod's emptyDir)."""
    raw = os.environ.get("SANDBOX_WORKSPACE") or ""
    workspace = Path(raw)
    if not raw or not workspace.is_dir():
        raise SystemExit(f"SANDBOX_ISOLATION=pod needs SANDBOX_WORKSPACE, an existing folder (got {raw!r})")
    if any(workspace.iterdir()):
        raise SystemExit(f"SANDBOX_WORKSPACE={raw}: not empty; each rollout needs a fresh workspace")
    return workspace


class Tools:
    """The model's tools, every one run in the sandbox (file tools too: paths are the sandbox's).
    `isolation="pod"`: plain child processes in the workspace (the pod is the sandbox)."""

    def __init__(self, workspace: Path, timeout: float, output_chars: int, isolation: str = "bwrap") -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation {isolation!r}: expected one of {', '.join(ISOLATIONS)}")
        self.workspace = workspace
        self.box = Sandbox(workspace=workspace) if isolation == "bwrap" else None
        self.timeout, self.output_chars = timeout, output_chars
        self.commands = 0

    def _popen(self, argv: list[str], stdin: bool) -> subprocess.Popen:
        pipes: dict[str, Any] = {
            "stdin": subprocess.PIPE if stdin else subprocess.DEVNULL,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.PIPE,
            "text": True,
        }
        if self.box is not None:
            # bwrap itself gets an empty environment: its own /proc/1/environ is readable inside the
            # sandbox (PID 1 there), and this process holds AGL_KEY and the reference ANSWER.
            return self.box.popen(argv, env={"PATH": "/usr/bin:/bin"}, **pipes)
        return subprocess.Popen(argv, cwd=self.workspace, env=COMMAND_ENV, start_new_session=True, **pipes)

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        self.commands += 1
        proc = self._popen(argv, stdin is not None)
        timed_out = False
        try:
            stdout, stderr = proc.communicate(stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill(proc)  # its process group (in bwrap: its whole PID namespace)
            try:
                stdout, stderr = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # pod mode: a process that left the group holds the pipes
                stdout, stderr = "", "[output lost: a process the command started still holds it]"
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
        result = SandboxResult(proc.returncode, stdout or "", stderr or "", timed_out)
        text = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
        if len(text) > self.output_chars:
            half = self.output_chars // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
        status = "timed out" if result.timed_out else f"exit {result.returncode}"
        return f"[{status}]\n{text}"

    def shell(self, command: str) -> str:
        return self._run(["bash", "-c", command])

    def python(self, code: str) -> str:
        return self._run(["python3", "-"], stdin=code)

    def read_file(self, path: str, start: int = 1, lines: int = 200) -> str:
        first, count = max(1, int(start)), max(1, min(int(lines), 2000))
        return self._run(["sed", "-n", f"{first},{first + count - 1}p", "--", path])

    def write_file(self, path: str, content: str) -> str:
        return self._run(
            ["sh", "-c", 'cat > "$1" && echo "wrote $(wc -c < "$1") bytes to $1"', "sh", path], content
        )

    def call(self, name: str, arguments: str) -> str:
        """Run the tool the model called; malformed arguments get an error message, never a crash."""
        if name not in ("shell", "python", "read_file", "write_file"):
            return f"error: no tool {name!r}; the tools are shell, python, read_file, write_file, submit"
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise TypeError("arguments must be a JSON object")
            if name == "shell":
                return self.shell(_text(args, "command"))
            if name == "python":
                return self.python(_text(args, "code"))
            if name == "write_file":
                return self.write_file(_text(args, "path"), _text(args, "content"))
            return self.read_file(
                _text(args, "path"), _integer(args, "start", 1), _integer(args, "lines", 200)
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return f"error: bad arguments for {name}: {type(exc).__name__}: {exc}"


def _text(args: dict[str, Any], key: str) -> str:
    value = args[key]
    if not isinstance(value, str):
        raise TypeError(f"{key!r} must be a string")
    return value


def _integer(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key!r} must be an integer")
    return value


def run_episode(
    client: OpenAI, tools: Tools, question: str, max_turns: int, max_tokens: int
) -> tuple[str | None, int]:
    """(the submitted answer or None, model calls made)."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    for turn in range(1, max_turns + 1):
        try:
            response = client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens
            )
        except BadRequestError as exc:  # e.g. the conversation outgrew the model's context
            log.warning("model call %d refused: %s", turn, exc)
            return None, turn - 1
        message = response.choices[0].message
        if not message.tool_calls:
            messages.append({"role": "assistant", "content": message.content or ""})
            messages.append({"role": "user", "content": "Use a tool, or call submit with your answer."})
            continue
        assistant = message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        messages.append(cast(ChatCompletionMessageParam, assistant))
        for call in message.tool_calls:
            if call.type != "function":  # only function tools are offered
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "error: not a function tool"}
                )
                continue
            if call.function.name == "submit":
                try:
                    return str(json.loads(call.function.arguments or "{}")["answer"]), turn
                except (json.JSONDecodeError, KeyError, TypeError):
                    output = 'error: submit takes {"answer": "..."}'
            else:
                output = tools.call(call.function.name, call.function.arguments)
            log.info("tool %s -> %s", call.function.name, output[:200].replace("\n", " | "))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return None, max_turns


class SandboxAgent:
    """The rollout entry point (`agent_class: sandbox_agent:SandboxAgent`)."""

    def run(self) -> float:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        family, seed = os.environ["TASK_FAMILY"], int(os.environ["TASK_SEED"])
        mode = isolation()
        if mode == "pod":
            hide_this_process()  # first: the model's commands run as this process's user
            workspace = pod_workspace()
        else:
            workspace = Path(tempfile.mkdtemp(prefix="llm-in-sandbox-"))
        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=6,
            timeout=300.0,
        )
        try:
            tasks.materialize(family, seed, workspace, os.environ.get("TASK_DOCUMENTS") or None)
            tools = Tools(
                workspace,
                setting("SANDBOX_COMMAND_TIMEOUT", 30.0),
                int(setting("SANDBOX_OUTPUT_CHARS", 4000)),
                mode,
            )
            submitted, calls = run_episode(
                client,
                tools,
                os.environ["QUESTION"],
                int(setting("SANDBOX_MAX_TURNS", 12)),
                int(setting("SANDBOX_MAX_TOKENS", 1024)),
            )
        finally:
            client.close()
            if mode == "bwrap":  # a pod's emptyDir goes with the pod
                shutil.rmtree(workspace, ignore_errors=True)
        value = tasks.reward(family, submitted, os.environ["ANSWER"])
        log.info(
            "episode family=%s isolation=%s model_calls=%d sandbox_commands=%d submitted=%r reward=%s "
            "workspace=%s",
            family,
            mode,
            calls,
            tools.commands,
            submitted,
            value,
            workspace,
        )
        reason = f"family={family} submitted={submitted!r}"
        post_reward(value, source="llm_in_sandbox", reason=reason[:500])
        return value


if __name__ == "__main__":
    SandboxAgent().run()
