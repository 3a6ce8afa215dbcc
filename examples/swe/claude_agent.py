"""One rollout of Claude Code (npm `@anthropic-ai/claude-code`, Anthropic's proprietary software under
its own terms: see README.md), unchanged, on one task of the bank, over the Anthropic Messages API.

The Controller starts this (in `.venv-swe`, whose Python has pytest) with the rollout's environment:
`TASK_ID`, `AGL_ANTHROPIC_BASE_URL`, `AGL_KEY`, `AGL_EVENT_URL`. It runs `claude -p PROBLEM_STATEMENT`
(print mode: one task, no terminal, every tool allowed) in the workspace with `ANTHROPIC_BASE_URL` the
Gateway's per-attempt Anthropic URL and `ANTHROPIC_API_KEY` the scoped key; its home and config
folder are fresh per rollout. The whole Claude Code process runs in our bubblewrap sandbox with only
the Gateway reachable (`harness_box.py`); its own sandbox is not used. Then grades and posts the reward.

Claude Code asks every model for `max_tokens` 32000, more than a small model's whole context: an
engine answers such a request with a 400 that Claude Code cannot recover from. The harness asks for
SWE_CLAUDE_MAX_OUTPUT_TOKENS instead (Claude Code's own `CLAUDE_CODE_MAX_OUTPUT_TOKENS`; 4096 here):
set it to what the served context leaves after the prompt.

Environment knobs: SWE_HARNESS_TIMEOUT seconds (900), SWE_GRADE_TIMEOUT (120), SWE_CLAUDE_PREFIX (the
npm prefix Claude Code is installed in; default: .npm-claude/ at the repository root, `make claude`),
SWE_CLAUDE_MAX_OUTPUT_TOKENS (4096), SWE_CLAUDE_CONTEXT_WINDOW (the served context in tokens, for
Claude Code's auto-compaction, `CLAUDE_CODE_AUTO_COMPACT_WINDOW`; unset: Claude Code's own guess for
a model name it does not know).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from examples.swe.harness_box import HOME, REPO, inner_url, run_rollout, scoped_key

NPM_PREFIX = REPO / ".npm-claude"
MODEL = "policy"  # the Gateway's model name; every call, the small background ones too, goes to it
MAX_OUTPUT_TOKENS = 4096

# Nothing but the model calls leaves the process: no telemetry, error reports, update checks, feedback
# surveys or other non-essential requests; no extended thinking (the policy does not write Anthropic
# thinking blocks).
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "MAX_THINKING_TOKENS": "0",
    # no per-request billing line at the top of the system prompt
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
}


def claude_settings() -> dict[str, object]:
    """Claude Code's own settings.json: every tool allowed without asking (print mode cannot ask)."""
    return {"permissions": {"defaultMode": "bypassPermissions"}, "includeCoAuthoredBy": False}


def positive(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = int(raw) if raw.strip().isdigit() else 0
    if value < 1:
        raise SystemExit(f"{name} must be a positive integer, got {raw!r}")
    return value


def npm_prefix() -> Path:
    return Path(os.environ.get("SWE_CLAUDE_PREFIX") or NPM_PREFIX).absolute()


class ClaudeSweAgent:
    def run(self) -> None:
        gateway_url = os.environ["AGL_ANTHROPIC_BASE_URL"]
        max_tokens = positive("SWE_CLAUDE_MAX_OUTPUT_TOKENS", MAX_OUTPUT_TOKENS)
        window = positive("SWE_CLAUDE_CONTEXT_WINDOW", None)

        def prepare(home: Path) -> tuple[list[str], dict[str, str], list[Path], list[Path]]:
            config = home / ".claude"
            config.mkdir()
            (config / "settings.json").write_text(json.dumps(claude_settings()))
            prefix = npm_prefix()
            command = [str(prefix / "node_modules" / ".bin" / "claude"), "-p", "--model", MODEL,
                       "--dangerously-skip-permissions", "--output-format", "text"]  # fmt: skip
            env = {
                "HOME": str(HOME),
                "CLAUDE_CONFIG_DIR": str(HOME / ".claude"),
                "ANTHROPIC_BASE_URL": inner_url(gateway_url),
                "ANTHROPIC_API_KEY": scoped_key(),
                "ANTHROPIC_MODEL": MODEL,
                "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_tokens),
                "NO_COLOR": "1",
                # Claude Code refuses to skip its permission prompts as root unless told it is in a
                # sandbox: it is (ours), and print mode has no one to answer the prompts.
                "IS_SANDBOX": "1",
                **QUIET,
            }
            if window is not None:
                env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(window)
            return command, env, [], [prefix]

        run_rollout("claude", gateway_url, prepare)
