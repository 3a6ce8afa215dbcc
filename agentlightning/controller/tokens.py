"""Each agent's AGL_KEY: a token the Gateway signs for its one attempt (docs/security.md).

A v1.0 Gateway has no token route; against it the controller passes its own key on, as v1.0 did.
"""

from __future__ import annotations

from agentlightning.client import AsyncGatewayClient, GatewayError, GatewayUnavailable, NotFound
from agentlightning.controller.runner import LaunchError
from agentlightning.log import get_logger

log = get_logger("controller")
UNKNOWN_ROUTE = "Not Found"  # FastAPI's answer for a route it does not have (v1.0's Gateway)


class AgentKeys:
    def __init__(self, client: AsyncGatewayClient, controller_key: str) -> None:
        self.client = client
        self.controller_key = controller_key
        self.tokens_supported: bool | None = None  # None: not known yet

    async def key_for(self, rollout_id: str, attempt_id: str) -> str:
        """The key to give the agent of this attempt. Raises LaunchError when none can be had."""
        if self.tokens_supported is False:
            return self.controller_key
        try:
            token = await self.client.mint_agent_token(rollout_id, attempt_id)
        except NotFound as exc:
            if exc.detail != UNKNOWN_ROUTE:
                raise LaunchError(f"no agent token: {exc.detail}") from None
            self.tokens_supported = False
            log.warning(
                "agent_tokens_unsupported",
                hint="the Gateway (v1.0?) cannot mint agent tokens: agents get the controller's key",
            )
            return self.controller_key
        except GatewayUnavailable as exc:
            raise LaunchError(f"no agent token, the Gateway is unreachable: {exc}", retryable=True) from None
        except GatewayError as exc:
            raise LaunchError(f"no agent token: {exc.status_code} {exc.detail}") from None
        self.tokens_supported = True
        return token.token
