"""Agent tokens: the controller asks for one per attempt and hands it to the agent as AGL_KEY."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException

from agentlightning.schemas import AgentToken, AgentTokenRequest
from agentlightning.server.auth import token_still_valid
from agentlightning.server.state import GatewayState, state_dependency
from agentlightning.server.store import RolloutNotFound

router = APIRouter(prefix="/api/agent-tokens", tags=["auth"])
State = Annotated[GatewayState, Depends(state_dependency)]


@router.post("", response_model=AgentToken)
async def mint_agent_token(body: AgentTokenRequest, state: State) -> AgentToken:
    """A token scoped to one attempt of a live rollout (an addition over v1.0; docs/security.md)."""
    rollout = await state.store.get_rollout(body.rollout_id)
    if rollout is None:
        raise RolloutNotFound(body.rollout_id)
    why = token_still_valid(rollout, body.attempt_id, rollout.status.created_at)
    if why is not None:
        raise HTTPException(409, f"no token for attempt {body.attempt_id!r}: {why}")
    token = state.auth.signer.mint(body.rollout_id, body.attempt_id, rollout.status.created_at)
    return AgentToken(token=token, rollout_id=body.rollout_id, attempt_id=body.attempt_id)
