"""One rollout of OpenAI's Codex CLI (npm `@openai/codex`, Apache-2.0), unchanged, on one task of the bank.

The Controller starts this (in `.venv-swe`, whose Python has pytest) with the rollout's environment:
`TASK_ID`, `AGL_OPENAI_BASE_URL` / `OPENAI_BASE_URL`, `AGL_KEY` / `OPENAI_API_KEY`, `AGL_EVENT_URL`. It
  1. checks the task out into a fresh folder (no hidden tests, no git history);
  2. writes Codex's own `config.toml` (a custom model provider: the Gateway's per-attempt URL,
     `wire_api = "responses"`, the scoped key read from `AGL_KEY`) and runs `codex exec` with the
     problem statement, the whole Codex process inside our bubblewrap sandbox: the workspace at
     /workspace, Codex's home, no network but a relay to the Gateway (`relay.py`);
  3. grades the workspace here, outside the sandbox, and posts the reward.

Why the whole process in bwrap and Codex's own sandbox off (`sandbox_mode = "danger-full-access"`):
Codex runs the model's commands as its own children, with no hook to wrap them, so the only way to
put them in our sandbox (the one the grader and the reward-hacking suite are checked against) is to
put Codex there; its own Linux sandbox would then be a sandbox inside a sandbox with nothing left to
take away. It also confines the harness itself: it reads only the workspace (not the repository,
whose task generator would give the hidden tests away) and reaches only the Gateway.

Environment knobs: SWE_HARNESS_TIMEOUT seconds (900), SWE_GRADE_TIMEOUT (120), SWE_CODEX_PREFIX (the npm
prefix Codex is installed in; default: .npm-codex/ at the repository root, `make codex`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from agentlightning.sandbox import kill
from examples.swe.bank import find
from examples.swe.grader import grade
from examples.swe.mini_agent import post_reward
from examples.swe.relay import INNER, GatewayRelay
from examples.swe.tasks import checkout
from examples.swe.workspace import agent_sandbox

REPO = Path(__file__).resolve().parents[2]
NPM_PREFIX = REPO / ".npm-codex"
INNER_PORT = 8080  # on the sandbox's own loopback: always free there
# Codex features that call out to OpenAI's services or add tools this model is not trained on
# (sub-agents, goals, web search, plugins, image generation) are switched off in its config.
CONFIG = """\
model = "policy"
model_provider = "agl"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[history]
persistence = "none"

[agents]
enabled = false

[features]
goals = false
plugins = false
apps = false
image_generation = false
shell_snapshot = false
skill_search = false
tool_suggest = false

[model_providers.agl]
name = "Agent Lightning Gateway"
base_url = {base_url}
env_key = "AGL_KEY"
wire_api = "responses"
"""


def codex_config(base_url: str) -> str:
    return CONFIG.format(base_url=json.dumps(base_url))  # a JSON string is a TOML basic string


def npm_prefix() -> Path:
    return Path(os.environ.get("SWE_CODEX_PREFIX") or NPM_PREFIX).absolute()


def sandboxed_codex(ws: Path, home: Path, socket_path: Path, key: str, prompt: str) -> list[str]:
    """The bwrap command line: the inner relay, then `codex exec` on the workspace."""
    prefix = npm_prefix()
    box = agent_sandbox(ws)
    box = type(box)(
        workspace=box.workspace,
        mount_at=box.mount_at,
        read_only=box.read_only,
        env={**box.env, "CODEX_HOME": str(home), "AGL_KEY": key, "NO_COLOR": "1", "RUST_LOG": "error"},
        path=box.path,
    )
    command = [
        "python", "-c", INNER, str(socket_path), str(INNER_PORT), "--",
        str(prefix / "node_modules" / ".bin" / "codex"), "exec", "--skip-git-repo-check", "-C", box.mount_at, prompt,
    ]  # fmt: skip
    argv = box.argv(command)
    # Codex's home and the relay's socket read-write, the npm prefix read-only, at their own paths.
    extra = ["--bind", str(home), str(home), "--bind", str(socket_path.parent), str(socket_path.parent)]
    extra += ["--ro-bind", str(prefix.resolve()), str(prefix.resolve())]
    if prefix != prefix.resolve():  # reached through a link: its own path must work inside too
        extra += ["--ro-bind", str(prefix.resolve()), str(prefix)]
    at = argv.index("--")
    return [*argv[:at], *extra, *argv[at:]]


class CodexSweAgent:
    def run(self) -> None:
        task = find(os.environ["TASK_ID"])
        gateway_url = os.environ.get("OPENAI_BASE_URL") or os.environ["AGL_OPENAI_BASE_URL"]
        key = os.environ.get("OPENAI_API_KEY") or os.environ["AGL_KEY"]
        work = Path(tempfile.mkdtemp(prefix="agl-swe-codex-"))
        try:
            ws = checkout(task, work / "ws")
            home, run = work / "codex-home", work / "run"
            home.mkdir()
            run.mkdir(mode=0o700)
            url = urlsplit(gateway_url)
            inner_url = f"http://127.0.0.1:{INNER_PORT}{url.path}"
            (home / "config.toml").write_text(codex_config(inner_url))
            timeout = float(os.environ.get("SWE_HARNESS_TIMEOUT", "900"))
            with GatewayRelay(run / "gateway.sock", url.hostname or "127.0.0.1", url.port or 80) as relay:
                argv = sandboxed_codex(ws, home, relay.path, key, task.problem_statement)
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, start_new_session=True,
                )  # fmt: skip
                try:
                    output, _ = proc.communicate(timeout=timeout)
                    sys.stdout.write(output[-8000:])
                    print(f"codex exited with {proc.returncode}", flush=True)
                except subprocess.TimeoutExpired:
                    kill(proc)
                    print("codex ran past SWE_HARNESS_TIMEOUT; grading what it left", flush=True)
            result = grade(task, ws, timeout=float(os.environ.get("SWE_GRADE_TIMEOUT", "120")))
            print(
                json.dumps(
                    {"instance_id": task.instance_id, "reward": result.reward, "ignored": result.ignored}
                )
            )
            post_reward(result.reward, {"instance_id": task.instance_id, "resolved": result.resolved})
        finally:
            shutil.rmtree(work, ignore_errors=True)
