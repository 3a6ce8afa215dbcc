"""One rollout of OpenAI's Codex CLI (npm `@openai/codex`, Apache-2.0), unchanged, on one task of the bank.

The Controller starts this (in `.venv-swe`, whose Python has pytest) with the rollout's environment:
`TASK_ID`, `AGL_OPENAI_BASE_URL`, `AGL_KEY`, `AGL_EVENT_URL`. It writes Codex's own `config.toml` (a
custom model provider: the Gateway's per-attempt URL, `wire_api = "responses"`, the scoped key read
from `AGL_KEY`) and runs `codex exec PROBLEM_STATEMENT` in the workspace, the whole Codex process in
our bubblewrap sandbox with only the Gateway reachable (`harness_box.py`, which says why); Codex's
own sandbox is off (`sandbox_mode = "danger-full-access"`). Then grades and posts the reward.

Environment knobs: SWE_HARNESS_TIMEOUT seconds (900), SWE_GRADE_TIMEOUT (120), SWE_CODEX_PREFIX (the
npm prefix Codex is installed in; default: .npm-codex/ at the repository root, `make codex`),
SWE_CODEX_CONFIG (more of Codex's own `config.toml`, put first: e.g.
`model_auto_compact_token_limit = 6000` makes Codex compact its history, as on a long task).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from examples.swe.harness_box import HOME, REPO, inner_url, run_rollout, scoped_key

NPM_PREFIX = REPO / ".npm-codex"
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


def codex_config(base_url: str, extra: str = "") -> str:
    """Codex's config.toml; `extra` goes first, so that its top-level keys precede every table."""
    config = CONFIG.format(base_url=json.dumps(base_url))  # a JSON string is a TOML basic string
    return f"{extra.strip()}\n{config}" if extra.strip() else config


def npm_prefix() -> Path:
    return Path(os.environ.get("SWE_CODEX_PREFIX") or NPM_PREFIX).absolute()


class CodexSweAgent:
    def run(self) -> None:
        gateway_url = os.environ["AGL_OPENAI_BASE_URL"]

        def prepare(home: Path) -> tuple[list[str], dict[str, str], list[Path], list[Path]]:
            extra = os.environ.get("SWE_CODEX_CONFIG", "")
            (home / "config.toml").write_text(codex_config(inner_url(gateway_url), extra))
            prefix = npm_prefix()
            command = [str(prefix / "node_modules" / ".bin" / "codex"), "exec", "--skip-git-repo-check",
                       "-C", "/workspace"]  # fmt: skip
            env = {"CODEX_HOME": str(HOME), "AGL_KEY": scoped_key(), "NO_COLOR": "1", "RUST_LOG": "error"}
            return command, env, [], [prefix]

        run_rollout("codex", gateway_url, prepare)
