"""`GET /metrics`: the Gateway's Prometheus metrics (text exposition format)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agentlightning.server.state import GatewayState, state_dependency

router = APIRouter(tags=["metrics"])
State = Annotated[GatewayState, Depends(state_dependency)]


@router.get("/metrics", response_class=Response)
async def metrics(state: State) -> Response:
    if state.metrics is None:
        raise HTTPException(404, "metrics are off on this Gateway: start it with metrics.enabled=true")
    # Rollouts by state are counted now (one grouped query), not kept on every change.
    state.metrics.rollout_counts = await state.store.count_by_state()
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
