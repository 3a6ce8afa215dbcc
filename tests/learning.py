"""What the suite asserts of a training run's metrics: that an update had signal and moved the
weights, and that validation rose. `metrics.jsonl` records, as `read_metrics` returns them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

SIGNAL_HOOKS = str(Path(__file__).resolve().parent / "signal_hooks.py")


def steps_with_signal(records: Sequence[dict[str, Any]]) -> list[int]:
    """The steps that trained on at least one group with non-zero advantages and whose update
    changed the weights (`actor/param_norm_change`, the torch backend's)."""
    return [
        int(r["step"])
        for r in records
        if r.get("training/n_groups", 0) > r.get("training/n_zero_adv_groups", 0)
        and r.get("actor/param_norm_change", 0.0) > 0.0
    ]


def assert_updates_with_signal(records: Sequence[dict[str, Any]]) -> None:
    trained = [r for r in records if "training/reward" in r]
    assert trained, "no training step recorded"
    assert steps_with_signal(records), (
        "no step had a non-zero advantage and changed the weights:\n"
        + "\n".join(
            str(
                {
                    k: r.get(k)
                    for k in (
                        "step",
                        "training/n_groups",
                        "training/n_zero_adv_groups",
                        "actor/param_norm_change",
                    )
                }
            )
            for r in trained
        )
    )


def validation_curve(records: Sequence[dict[str, Any]], key: str = "val/reward") -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in records if key in r]
