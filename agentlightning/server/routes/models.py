"""Inference endpoints the proxy routes to, registered by the trainer with their policy version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from agentlightning.schemas import Model, now
from agentlightning.server.state import GatewayState, state_dependency

router = APIRouter(prefix="/api/models", tags=["models"])
State = Annotated[GatewayState, Depends(state_dependency)]


@router.post("", status_code=201, response_model=list[Model], response_model_exclude_none=True)
async def register_models(body: list[Model], state: State) -> list[Model]:
    """Upsert by (model, endpoint): registering again updates the version, and renews a lease
    (`lease_seconds`: the endpoint expires that long after, 0 removes it; without one it stays
    until deleted)."""
    at = now()
    leased = [
        m.model_copy(update={"expires_at": None if m.lease_seconds is None else at + m.lease_seconds})
        for m in body
    ]
    return await state.models.upsert(leased)


@router.get("", response_model=list[Model], response_model_exclude_none=True)
async def list_models(state: State) -> list[Model]:
    return state.models.all()


@router.delete("")
async def delete_models(state: State) -> dict[str, str]:
    await state.models.clear()
    return {"status": "ok"}
