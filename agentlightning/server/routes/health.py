from __future__ import annotations

from fastapi import APIRouter

from agentlightning.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health()
