"""Training runs' metrics: the trainer posts each step's metrics, the dashboard plots them.

POST /api/runs/{run_id}/metrics   [{step, metrics: {name: value}, time?}, ...]
GET  /api/runs                    the runs, most recently updated first
GET  /api/runs/{run_id}/metrics?after_step=-1
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from agentlightning.schemas import ID_PATTERN, MetricPoint, RunMetrics, RunSummary
from agentlightning.server.state import GatewayState, state_dependency

router = APIRouter(prefix="/api/runs", tags=["runs"])
State = Annotated[GatewayState, Depends(state_dependency)]
RunId = Annotated[str, Path(pattern=ID_PATTERN)]


@router.post("/{run_id}/metrics")
async def post_metrics(run_id: RunId, body: list[MetricPoint], state: State) -> dict[str, int | str]:
    return {"run_id": run_id, "n_points": await state.store.add_run_points(run_id, body)}


@router.get("", response_model=list[RunSummary])
async def list_runs(state: State) -> list[RunSummary]:
    return await state.store.list_runs()


@router.get("/{run_id}/metrics", response_model=RunMetrics)
async def get_metrics(
    run_id: RunId, state: State, after_step: Annotated[int, Query(ge=-1)] = -1
) -> RunMetrics:
    points = await state.store.run_points(run_id, after_step)
    if points is None:
        raise HTTPException(404, f"run {run_id!r} has posted no metrics")
    return RunMetrics(run_id=run_id, points=points)
