"""Training runs' metrics, posted by trainers for the dashboard's training page: the memory
store's table (SQLite and Postgres keep them in tables of their own, with the same bounds).

The trainer's own sinks (metrics.jsonl, TensorBoard, W&B) are the record; this is the live view.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from agentlightning.schemas import MetricPoint, RunSummary
from agentlightning.server.store.base import MAX_POINTS_PER_RUN, MAX_RUNS, RUN_KEYS_FROM


class RunMetricsTable:
    def __init__(self, max_runs: int = MAX_RUNS, max_points: int = MAX_POINTS_PER_RUN) -> None:
        self.max_runs = max_runs
        self.max_points = max_points
        self._runs: OrderedDict[str, list[MetricPoint]] = OrderedDict()
        self._updated: dict[str, float] = {}

    def add(self, run_id: str, points: list[MetricPoint]) -> int:
        """Append points in step order. A step at or before the run's last one replaces the
        points from there on (a run resumed from a checkpoint logs those steps again)."""
        series = self._runs.get(run_id)
        if series is None:
            series = self._runs[run_id] = []
            while len(self._runs) > self.max_runs:
                old, _ = self._runs.popitem(last=False)
                self._updated.pop(old, None)
        self._runs.move_to_end(run_id)
        at = time.time()
        for point in points:
            if point.time is None:
                point = point.model_copy(update={"time": at})
            while series and series[-1].step >= point.step:
                series.pop()
            series.append(point)
        if len(series) > self.max_points:
            del series[: len(series) - self.max_points]
        self._updated[run_id] = at
        return len(series)

    def runs(self) -> list[RunSummary]:
        out = []
        for run_id, series in self._runs.items():
            keys = sorted({k for p in series[-RUN_KEYS_FROM:] for k in p.metrics})
            out.append(
                RunSummary(
                    run_id=run_id,
                    n_points=len(series),
                    last_step=series[-1].step if series else None,
                    updated_at=self._updated.get(run_id, 0.0),
                    keys=keys,
                )
            )
        return sorted(out, key=lambda r: r.updated_at, reverse=True)

    def points(self, run_id: str, after_step: int = -1) -> list[MetricPoint] | None:
        series = self._runs.get(run_id)
        if series is None:
            return None
        return [p for p in series if p.step > after_step]


# --- for the SQL stores: rows to the API's types ---------------------------------------------


def run_summaries(runs: Sequence[Sequence[Any]], last: Sequence[Sequence[Any]]) -> list[RunSummary]:
    """`runs`: (run_id, updated_at, n_points, last_step), newest first; `last`: (run_id, metrics
    JSON) of each run's last RUN_KEYS_FROM points."""
    keys: dict[str, set[str]] = {}
    for run_id, metrics in last:
        keys.setdefault(run_id, set()).update(orjson.loads(metrics))
    return [
        RunSummary(
            run_id=run_id,
            n_points=n,
            last_step=last_step,
            updated_at=updated_at,
            keys=sorted(keys.get(run_id, ())),
        )
        for run_id, updated_at, n, last_step in runs
    ]


def metric_points(rows: Sequence[Sequence[Any]]) -> list[MetricPoint]:
    """(step, time, metrics JSON) rows as points."""
    return [MetricPoint(step=step, time=at, metrics=orjson.loads(metrics)) for step, at, metrics in rows]
