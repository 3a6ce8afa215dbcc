"""Training runs' metrics, posted by trainers for the dashboard's training page.

Kept in the Gateway's memory, bounded: the trainer's own sinks (metrics.jsonl, TensorBoard,
W&B) are the record; this is the live view. A Gateway restart starts it empty.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from agentlightning.schemas import MetricPoint, RunSummary

MAX_RUNS = 64
MAX_POINTS_PER_RUN = 100_000


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
            keys = sorted({k for p in series[-50:] for k in p.metrics})
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
