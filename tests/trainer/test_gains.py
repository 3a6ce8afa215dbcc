"""The gain keeper's verdicts (trainer/gains.py): a new best, holding within the margin, a
collapse after `patience` validations below it, rollbacks until `max_rollbacks`, then a stop."""

from __future__ import annotations

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.trainer.config import CollapseGuardConfig, TrainerConfig
from agentlightning.trainer.gains import GainKeeper, Verdict


def verdicts(keeper: GainKeeper, values: list[float]) -> list[str]:
    return [keeper.observe(step, v).value for step, v in enumerate(values)]


def test_a_new_best_holding_and_a_collapse_rolled_back_at_a_lower_lr() -> None:
    keeper = GainKeeper(CollapseGuardConfig(margin=0.15, patience=2, lr_scale=0.5))
    got = verdicts(keeper, [0.3, 0.6, 0.5, 0.4, 0.6, 0.44, 0.4])
    # 0.5 is within 0.15 of 0.6; 0.4 is below once; 0.6 ties (not a new best) and resets the count;
    # 0.44 and 0.4 are two in a row below 0.45: a collapse.
    assert got == ["new_best", "new_best", "holding", "holding", "holding", "holding", "roll_back"]
    s = keeper.state
    assert (s.best_value, s.best_step, s.rollbacks, s.lr_scale, s.below) == (0.6, 1, 1, 0.5, 0)


def test_rollbacks_compound_the_lr_scale_then_the_run_stops() -> None:
    keeper = GainKeeper(CollapseGuardConfig(margin=0.1, patience=1, lr_scale=0.5, max_rollbacks=2))
    assert verdicts(keeper, [0.8, 0.1, 0.1, 0.1]) == ["new_best", "roll_back", "roll_back", "stop"]
    assert keeper.state.lr_scale == 0.25 and keeper.state.rollbacks == 2


def test_action_stop_and_a_disabled_guard() -> None:
    stop = GainKeeper(CollapseGuardConfig(action="stop", patience=1))
    assert verdicts(stop, [0.5, 0.0]) == ["new_best", "stop"]
    off = GainKeeper(CollapseGuardConfig(enable=False, patience=1))
    assert verdicts(off, [0.5, 0.0, 0.0, 0.9]) == ["new_best", "holding", "holding", "new_best"]


def test_the_state_survives_a_resume() -> None:
    guard = CollapseGuardConfig(patience=2)
    keeper = GainKeeper(guard)
    verdicts(keeper, [0.7, 0.1])
    resumed = GainKeeper(guard, keeper.state_dict())
    assert resumed.observe(2, 0.1) is Verdict.ROLL_BACK  # the first below-count was kept


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        (CollapseGuardConfig(action="rewind"), "action must be rollback or stop"),
        (CollapseGuardConfig(margin=-0.1), "margin must be >= 0"),
        (CollapseGuardConfig(patience=0), "patience must be >= 1"),
        (CollapseGuardConfig(lr_scale=0.0), r"lr_scale must be in \(0, 1\]"),
        (CollapseGuardConfig(max_rollbacks=-1), "max_rollbacks must be >= 0"),
    ],
)
def test_bad_guard_settings_name_the_key(guard: CollapseGuardConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=f"trainer.collapse_guard.{message}"):
        TrainerConfig(collapse_guard=guard).validate()


def test_the_best_metric_must_be_a_validation_metric() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.best_metric must be a validation metric"):
        TrainerConfig(best_metric="training/reward").validate()
