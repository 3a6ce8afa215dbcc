"""One rollout of mini-swe-agent (PyPI, MIT), unchanged, on one task of the bank.

The Controller starts this in `.venv-swe` (`make swe-venv`) with the rollout's environment:
`TASK_ID` (from the rollout input's `task_id`), `AGL_OPENAI_BASE_URL` and `AGL_KEY` (the Gateway's
per-attempt URL and scoped token; `OPENAI_BASE_URL` / `OPENAI_API_KEY` when set), `AGL_EVENT_URL`. It
  1. checks the task out into a fresh folder (no hidden tests, no git history);
  2. runs mini-swe-agent's own `mini` command with its own prompts (mini.yaml) and a config file
     that only points it at the Gateway (litellm's `openai/` provider) and makes its built-in
     bubblewrap environment use our sandbox's arguments: every command the model writes runs
     with the workspace only and no network;
  3. grades the workspace here, outside the sandbox, and posts the reward.
Environment knobs: SWE_STEP_LIMIT (30), SWE_HARNESS_TIMEOUT seconds (900), SWE_GRADE_TIMEOUT (120),
SWE_MINI_PROMPTS (unset: mini's own prompts; `short`: prompts/short.yaml; or a YAML file's path),
merged between mini.yaml and our config with mini's own `-c`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentlightning.agent_events import post_reward
from examples.swe.bank import find
from examples.swe.grader import grade
from examples.swe.tasks import checkout
from examples.swe.workspace import agent_sandbox

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


def prompt_specs(choice: str | None) -> list[str]:
    """mini's `-c` specs for its prompts: mini.yaml, then SWE_MINI_PROMPTS's file over it if set."""
    if not choice:
        return ["mini.yaml"]
    path = (
        PROMPTS_DIR / f"{choice}.yaml" if "/" not in choice and not choice.endswith(".yaml") else Path(choice)
    )
    if not path.is_file():
        raise SystemExit(f"SWE_MINI_PROMPTS={choice}: no such prompts file ({path})")
    return ["mini.yaml", str(path.resolve())]


def mini_config(ws: Path, base_url: str, api_key: str, step_limit: int) -> dict[str, Any]:
    """The config merged over mini.yaml: the Gateway as an OpenAI-compatible provider, our sandbox."""
    argv = agent_sandbox(ws).argv(["true"])
    # mini's environment adds `--bind CWD CWD --chdir CWD` itself: drop ours (bwrap warns about
    # a second --chdir on stderr, which mini would read as the command's output).
    args = argv[1 : argv.index("--")]
    for flag, width in (("--bind", 3), ("--chdir", 2)):
        at = args.index(flag)
        del args[at : at + width]
    return {
        "agent": {"mode": "yolo", "confirm_exit": False, "step_limit": step_limit, "cost_limit": 0},
        "model": {
            "model_name": "openai/policy",  # the Gateway sets the served model's name
            "model_kwargs": {"api_base": base_url, "api_key": api_key, "drop_params": True},
            "cost_tracking": "ignore_errors",
        },
        "environment": {
            "environment_class": "bubblewrap",
            "executable": argv[0],
            "wrapper_args": args,
            "cwd": str(ws.resolve()),
            "timeout": 60,
        },
    }


class MiniSweAgent:
    def run(self) -> None:
        task = find(os.environ["TASK_ID"])
        work = Path(tempfile.mkdtemp(prefix="agl-swe-"))
        try:
            ws = checkout(task, work / "ws")
            config = mini_config(
                ws,
                os.environ.get("OPENAI_BASE_URL") or os.environ["AGL_OPENAI_BASE_URL"],
                os.environ.get("OPENAI_API_KEY") or os.environ["AGL_KEY"],
                int(os.environ.get("SWE_STEP_LIMIT", "30")),
            )
            (work / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
            env = {
                **os.environ,
                "MSWEA_CONFIGURED": "true",  # no first-run questions
                "MSWEA_GLOBAL_CONFIG_DIR": str(work / "mswea"),
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches nothing at import
            }
            mini = Path(sys.executable).parent / "mini"
            specs = [*prompt_specs(os.environ.get("SWE_MINI_PROMPTS")), str(work / "config.yaml")]
            command = [str(mini), *(a for spec in specs for a in ("-c", spec)), "-t", task.problem_statement,
                       "-y", "--exit-immediately", "-o", str(work / "traj.json")]  # fmt: skip
            try:
                done = subprocess.run(
                    command, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                    timeout=float(os.environ.get("SWE_HARNESS_TIMEOUT", "900")),
                )  # fmt: skip
                sys.stdout.write(done.stdout[-4000:] + done.stderr[-4000:])
            except subprocess.TimeoutExpired:
                print("mini-swe-agent ran past SWE_HARNESS_TIMEOUT; grading what it left", flush=True)
            result = grade(task, ws, timeout=float(os.environ.get("SWE_GRADE_TIMEOUT", "120")))
            print(
                json.dumps(
                    {"instance_id": task.instance_id, "reward": result.reward, "ignored": result.ignored}
                )
            )
            post_reward(result.reward, instance_id=task.instance_id, resolved=result.resolved)
        finally:
            shutil.rmtree(work, ignore_errors=True)


# A Kubernetes Job's command (job-template.yaml): python -m examples.swe.mini_agent
if __name__ == "__main__":
    MiniSweAgent().run()
