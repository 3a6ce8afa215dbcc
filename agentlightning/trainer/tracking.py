"""Where a training run's metrics go: the console, a JSONL file, TensorBoard, W&B.

Every step's metrics also go to the Gateway (`POST /api/runs/{experiment}/metrics`) when the
Tracker is given a Gateway client, so that the dashboard's training page plots the run live;
a Gateway that cannot take them is reported once and training goes on.

`trainer.logger` lists the sinks, with verl's names where verl has them (`console`,
`tensorboard`, `wandb`) plus ours (`jsonl`). The console sink is a progress bar with the step,
the training reward, the last validation reward and the speed; validation results are printed
as lines above it. The JSONL file (`{output_dir}/metrics.jsonl`, one object per step with
`step` and every metric) is what tools and the demo read back.

TensorBoard and W&B are imported only when asked for; either asked for but not installed
(the core installs neither torch, which TensorBoard's writer needs, nor W&B) is reported once
and skipped, not a crash. The console sink draws its bar with tqdm where it is installed, else
prints a line per step.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from agentlightning.client import GatewayClient
from agentlightning.config.schema import ConfigError
from agentlightning.log import get_logger

log = get_logger("tracking")

SINKS = ("console", "jsonl", "tensorboard", "wandb")
METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file; a torn last line (a crash mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class Tracker:
    def __init__(
        self,
        sinks: Sequence[str],
        output_dir: str | Path,
        total_steps: int,
        first_step: int = 0,
        project: str = "agentlightning",
        experiment: str = "run",
        config: Mapping[str, Any] | None = None,
        stream: TextIO | None = None,
        gateway: GatewayClient | None = None,
    ) -> None:
        unknown = [s for s in sinks if s not in SINKS]
        if unknown:
            raise ConfigError(
                f"trainer.logger: unknown logger {unknown[0]!r}; choose from {', '.join(SINKS)}"
            )
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps = total_steps
        self.run_id = experiment
        self._gateway = gateway
        self._gateway_failing = False
        self.stream = stream or sys.stderr
        self._last_val: float | None = None
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        self._wandb: Any = None
        self._bar: Any = None
        if "jsonl" in sinks:
            path = self.output_dir / METRICS_FILE
            _truncate_after(path, first_step)  # a resumed run rewrites the steps after its checkpoint
            self._jsonl = open(path, "a")  # closed in close()
        if "tensorboard" in sinks:
            try:  # lazy: the core imports no torch, and does not install it (nor tensorboard)
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                log.warning(
                    "tensorboard_not_installed",
                    error=str(exc),
                    hint="pip install torch tensorboard, or drop tensorboard from trainer.logger",
                )
            else:
                self._tb = SummaryWriter(str(self.output_dir / "tensorboard"), purge_step=first_step or None)
        if "wandb" in sinks:
            try:
                import wandb
            except ImportError:
                log.warning(
                    "wandb_not_installed", hint="pip install wandb, or drop wandb from trainer.logger"
                )
            else:
                self._wandb = wandb.init(
                    project=project, name=experiment, config=dict(config or {}), resume="allow"
                )
        if "console" in sinks:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # not a core dependency: a line per step instead of a bar
                tqdm = None
            self._bar = (
                _LineProgress(total_steps, first_step, self.stream)
                if tqdm is None
                else tqdm(
                    total=total_steps,
                    initial=first_step,
                    desc="training",
                    unit="step",
                    file=self.stream,
                    dynamic_ncols=True,
                    mininterval=0.5,
                )
            )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._gateway is not None:
            self._post(clean, step)
        if "val/reward" in clean:
            self._last_val = clean["val/reward"]
            if self._bar is not None:
                self.print(f"step {step}: validation reward {clean['val/reward']:.3f}")
        if self._bar is not None and "training/reward" in clean:
            postfix = {"reward": f"{clean['training/reward']:.3f}"}
            if self._last_val is not None:
                postfix["val"] = f"{self._last_val:.3f}"
            if "timing/step_s" in clean:
                postfix["s/step"] = f"{clean['timing/step_s']:.1f}"
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(step - self._bar.n)

    def _post(self, metrics: dict[str, float], step: int) -> None:
        try:
            self._gateway.post_run_metrics(  # type: ignore[union-attr]  # _post runs only with a gateway
                self.run_id, [{"step": step, "metrics": metrics, "time": time.time()}]
            )
        except Exception as exc:  # the dashboard's view is a convenience: never stop training for it
            if not self._gateway_failing:
                log.warning("run_metrics_not_posted", run_id=self.run_id, step=step, error=str(exc))
            self._gateway_failing = True
        else:
            if self._gateway_failing:
                log.info("run_metrics_posted_again", run_id=self.run_id, step=step)
            self._gateway_failing = False

    def print(self, line: str) -> None:
        """A line above the progress bar (or on the stream when there is none)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None  # `print` after the close goes below the finished bar
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class _LineProgress:
    """The console sink where tqdm is not installed: one line per step instead of a bar."""

    def __init__(self, total: int, initial: int, stream: TextIO) -> None:
        self.n, self.total, self.stream = initial, total, stream
        self.postfix: dict[str, str] = {}

    def set_postfix(self, postfix: Mapping[str, str], refresh: bool = False) -> None:
        self.postfix = dict(postfix)

    def update(self, steps: int) -> None:
        self.n += steps
        details = "".join(f", {k} {v}" for k, v in self.postfix.items())
        self.write(f"training: step {self.n}/{self.total}{details}")

    def write(self, line: str, file: TextIO | None = None) -> None:
        stream = file or self.stream
        stream.write(line + "\n")
        stream.flush()

    def close(self) -> None:
        pass


def _truncate_after(path: Path, step: int) -> None:
    """Keep only the records up to `step` (0: none) of an existing metrics file."""
    if not path.exists():
        return
    kept = [r for r in read_metrics(path) if r.get("step", math.inf) <= step] if step > 0 else []
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
