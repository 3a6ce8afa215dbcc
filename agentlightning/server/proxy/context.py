"""An agent's `max_tokens` fitted to the served model's context.

vLLM refuses a request whose `max_tokens` is more than the model's whole context (`max_tokens=32000
cannot be greater than max_model_len=1024`), and up to that it generates what the context leaves
after the prompt. Claude Code asks every model for 32000 and ends its run on that 400; a small
served context is what CPU tests and short-context training use. So the proxy lowers a larger
`max_tokens` (or `max_completion_tokens`) to the endpoint's `max_model_len`, which vLLM lists in
`GET /v1/models`; an endpoint that lists none (another engine) gets the agent's value. The agent's
request is recorded as sent; the lowered value is among the call's proxy parameters. Each
endpoint is asked once, and again after a while (it may be restarted with another context).
"""

from __future__ import annotations

import time
from typing import Any

from agentlightning.server.proxy.upstream import UpstreamClient

LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
RECHECK_SECONDS = 300.0


class ContextLimits:
    def __init__(self, upstream: UpstreamClient) -> None:
        self.upstream = upstream
        self.known: dict[tuple[str, str], tuple[int | None, float]] = {}  # (endpoint, name) → (limit, when)

    async def of(self, endpoint: str, served_name: str) -> int | None:
        """The context length `endpoint` serves `served_name` with, or None when it does not say."""
        known = self.known.get((endpoint, served_name))
        if known is not None and time.monotonic() - known[1] < RECHECK_SECONDS:
            return known[0]
        limit = max_model_len(await self.upstream.get_json(endpoint, "/models"), served_name)
        self.known[(endpoint, served_name)] = (limit, time.monotonic())
        return limit


def max_model_len(listed: Any, served_name: str) -> int | None:
    """`max_model_len` of the model named `served_name` in a `GET /v1/models` answer (or of the only
    model listed); None when there is none."""
    cards = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(cards, list):
        return None
    cards = [c for c in cards if isinstance(c, dict)]
    named = [c for c in cards if c.get("id") == served_name] or (cards if len(cards) == 1 else [])
    limit = named[0].get("max_model_len") if named else None
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def fit_max_tokens(body: dict[str, Any], params: dict[str, Any], limit: int | None) -> None:
    """Set in `params` (what the proxy adds to the request) a `max_tokens` of `body` lowered to
    `limit`, where it asks for more."""
    if limit is None:
        return
    for key in LIMIT_KEYS:
        asked = params.get(key, body.get(key))
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > limit:
            params[key] = limit
