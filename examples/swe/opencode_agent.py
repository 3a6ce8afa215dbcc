"""One rollout of opencode (npm `opencode-ai`, MIT), unchanged, on one task of the bank, over the
Anthropic Messages API.

The Controller starts this (in `.venv-swe`, whose Python has pytest) with the rollout's environment:
`TASK_ID`, `AGL_ANTHROPIC_BASE_URL`, `AGL_KEY`, `AGL_EVENT_URL`. It writes opencode's own
`opencode.json`: its built-in `anthropic` provider (the Vercel AI SDK's Anthropic client) with the
Gateway's per-attempt Anthropic URL as `baseURL` and the scoped key read from `AGL_KEY`, one model
`policy`; then runs `opencode run PROBLEM_STATEMENT` in the workspace, the whole opencode process in
our bubblewrap sandbox with only the Gateway reachable (`harness_box.py`). opencode has no sandbox
of its own. Then grades and posts the reward.

Environment knobs: SWE_HARNESS_TIMEOUT seconds (900), SWE_GRADE_TIMEOUT (120), SWE_OPENCODE_PREFIX
(the npm prefix opencode is installed in; default: .npm-opencode/ at the repository root, `make
opencode`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from examples.swe.harness_box import HOME, REPO, inner_url, run_rollout, scoped_key

NPM_PREFIX = REPO / ".npm-opencode"


def opencode_config(base_url: str) -> dict[str, Any]:
    """The Gateway as opencode's Anthropic provider; nothing fetched, updated or shared; no title call
    (opencode's hidden `title` agent would add a call with another prompt to every rollout)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": "anthropic/policy",
        "small_model": "anthropic/policy",
        "autoupdate": False,
        "share": "disabled",
        "agent": {"title": {"disable": True}},
        "provider": {
            "anthropic": {
                # the AI SDK appends /messages to baseURL; the Gateway's Anthropic root + /v1
                "options": {"baseURL": base_url + "/v1", "apiKey": "{env:AGL_KEY}"},
                "models": {"policy": {"name": "policy"}},
            }
        },
    }


def npm_prefix() -> Path:
    return Path(os.environ.get("SWE_OPENCODE_PREFIX") or NPM_PREFIX).absolute()


class OpencodeSweAgent:
    def run(self) -> None:
        gateway_url = os.environ["AGL_ANTHROPIC_BASE_URL"]

        def prepare(home: Path) -> tuple[list[str], dict[str, str], list[Path], list[Path]]:
            (home / "opencode.json").write_text(json.dumps(opencode_config(inner_url(gateway_url))))
            prefix = npm_prefix()
            command = [str(prefix / "node_modules" / ".bin" / "opencode"), "run", "--dir", "/workspace"]
            env = {
                "AGL_KEY": scoped_key(),
                "HOME": str(HOME),
                "OPENCODE_CONFIG": str(HOME / "opencode.json"),
                "XDG_CONFIG_HOME": str(HOME / "config"),
                "XDG_DATA_HOME": str(HOME / "data"),
                "XDG_CACHE_HOME": str(HOME / "cache"),
                "XDG_STATE_HOME": str(HOME / "state"),
                "OPENCODE_DISABLE_MODELS_FETCH": "true",
                "OPENCODE_DISABLE_AUTOUPDATE": "true",
                "NO_COLOR": "1",
            }
            return command, env, [], [prefix]

        run_rollout("opencode", gateway_url, prepare)
