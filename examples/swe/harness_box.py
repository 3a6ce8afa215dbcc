"""Run a coding CLI (Codex, opencode) unchanged, the whole process inside the agent's bubblewrap sandbox.

These harnesses run the model's commands as their own children, with no hook to wrap each one, so
the harness goes into the sandbox with them: the workspace at /workspace (its working directory),
the harness's npm prefix read-only, its home read-write at `HOME` (one path for every rollout: a
temporary folder's name would differ in each prompt), and no network but a relay to the Gateway
(`relay.py`): it reaches the Gateway's per-attempt URL with the scoped key, and no other address.
Their own sandboxes (if any) are switched off in their config: a sandbox inside ours has nothing
left to take away. It also keeps the harness itself from the repository (whose task generator would
give the hidden tests away). Then the workspace is graded here, outside, and the reward posted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from agentlightning.agent_events import post_reward
from agentlightning.sandbox import Sandbox, kill
from examples.swe.bank import find
from examples.swe.grader import grade
from examples.swe.relay import INNER, GatewayRelay
from examples.swe.tasks import checkout
from examples.swe.workspace import agent_sandbox

REPO = Path(__file__).resolve().parents[2]
INNER_PORT = 8080  # on the sandbox's own loopback: always free there
HOME = PurePosixPath("/home/agent")  # the harness's home as it sees it


def inner_url(gateway_url: str) -> str:
    """The Gateway URL as the harness inside the sandbox reaches it (through the relay)."""
    return f"http://127.0.0.1:{INNER_PORT}{urlsplit(gateway_url).path}"


def harness_sandbox(
    ws: Path,
    socket_path: Path,
    env: Mapping[str, str],
    home: Path,
    read_write: Sequence[Path] = (),
    read_only: Sequence[Path] = (),
) -> Sandbox:
    """The agent's sandbox, with the harness's home (at `HOME`), its own folders and the relay's
    socket folder bound in."""
    box = agent_sandbox(ws)
    return replace(
        box,
        env={**box.env, **env},
        read_write=[*read_write, socket_path.parent],
        read_only=[*box.read_only, *read_only],
        mounts={str(HOME): home},
    )


def relayed(socket_path: Path, command: Sequence[str]) -> list[str]:
    """`command` run behind the inner relay, which serves the Gateway on the sandbox's loopback."""
    return ["python", "-c", INNER, str(socket_path), str(INNER_PORT), "--", *command]


def run_rollout(
    name: str,
    gateway_url: str,
    prepare: Callable[[Path], tuple[list[str], dict[str, str], list[Path], list[Path]]],
) -> None:
    """One rollout: check the task out, run the harness in the box, grade, post the reward.

    `prepare(home)` writes the harness's config under `home` (pointing it at `inner_url(gateway_url)`;
    inside, the harness finds it at `HOME`) and returns (command, env, read-write paths, read-only
    paths); the problem statement is the command's last argument."""
    task = find(os.environ["TASK_ID"])
    work = Path(tempfile.mkdtemp(prefix=f"agl-swe-{name}-"))
    try:
        ws = checkout(task, work / "ws")
        home, run = work / "home", work / "run"
        home.mkdir()
        run.mkdir(mode=0o700)
        command, env, read_write, read_only = prepare(home)
        url = urlsplit(gateway_url)
        timeout = float(os.environ.get("SWE_HARNESS_TIMEOUT", "900"))
        with GatewayRelay(run / "gateway.sock", url.hostname or "127.0.0.1", url.port or 80) as relay:
            box = harness_sandbox(ws, relay.path, env, home, read_write, read_only)
            # The box's `communicate` returns once nothing the harness started is left running:
            # the workspace is graded as it stands.
            proc = box.popen(
                relayed(relay.path, [*command, task.problem_statement]),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            try:
                output, _ = proc.communicate(timeout=timeout)
                sys.stdout.write(output[-8000:])
                print(f"{name} exited with {proc.returncode}", flush=True)
            except subprocess.TimeoutExpired:
                kill(proc)
                print(f"{name} ran past SWE_HARNESS_TIMEOUT; grading what it left", flush=True)
        result = grade(task, ws, timeout=float(os.environ.get("SWE_GRADE_TIMEOUT", "120")))
        print(
            json.dumps({"instance_id": task.instance_id, "reward": result.reward, "ignored": result.ignored})
        )
        post_reward(result.reward, instance_id=task.instance_id, resolved=result.resolved)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scoped_key() -> str:
    return os.environ.get("AGL_KEY") or os.environ["OPENAI_API_KEY"]
