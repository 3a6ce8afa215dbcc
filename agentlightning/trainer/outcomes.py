"""What a step trains on, by how each rollout ended (`agentlightning.outcomes`, docs/reliability.md).

The Gateway records each attempt's outcome from its own evidence (the proxy's failed calls, the
Controller's view of the process or pod). Here each outcome gets its treatment before any row,
reward or advantage is made, so every advantage estimator sees only the rollouts kept:

* infrastructure outcomes (`model_unavailable`, `sandbox_lost`, `pod_lost`, `timeout`, `lost`)
  are never trained: the rollout is dropped, whatever reward the agent reported;
* `agent_error`, `context_overflow`, `no_reward` follow their rule: `drop`; `keep` (train with the
  rollout's own reward, else `reward_fillna_value`: v1.0's treatment); `reward` (train with a set
  reward); `fail` (drop, and stop the run when their share of the step's rollouts passes
  `max_share`: a broken agent stops a run loudly instead of training on);
* a group that lost rollouts to the infrastructure is kept only while `min_group` of its rollouts
  remain, else dropped whole (its survivors are not the policy's sample of that prompt: the
  failures may have hit its hardest cases). A group thinned by the agent's own failures is kept,
  as before (a lone survivor gets advantage 0).

A rollout read from a Gateway that records no outcome (v1.0) gets one from what the trainer sees:
lost when the trainer failed it, `agent_error` when it failed, else `ok` or `no_reward`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentlightning.config.schema import ConfigError
from agentlightning.rewards import last_reward
from agentlightning.schemas import INFRASTRUCTURE_OUTCOMES, AttemptOutcome
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import FailedRolloutPolicy
from agentlightning.trainer.failures import AllRolloutsFailed

KEY = "agentlightning.outcomes"
METRIC_PREFIX = "rollout/outcome/"
DEFAULT_MIN_GROUP = 2
DEFAULT_MAX_SHARE = 0.25


class OutcomeAction(StrEnum):
    DROP = "drop"  # not trained
    KEEP = "keep"  # trained with its own reward, else reward_fillna_value (v1.0)
    REWARD = "reward"  # trained with the rule's `reward`
    FAIL = "fail"  # not trained; the run stops when their share passes `max_share`


CONFIGURABLE: tuple[AttemptOutcome, ...] = (
    AttemptOutcome.AGENT_ERROR,
    AttemptOutcome.CONTEXT_OVERFLOW,
    AttemptOutcome.NO_REWARD,
)
# What each rule key means with which action: a key that would do nothing is refused.
_RULE_KEYS: dict[str, OutcomeAction | None] = {
    "action": None,
    "reward": OutcomeAction.REWARD,
    "max_share": OutcomeAction.FAIL,
}


class OutcomeShareExceeded(AllRolloutsFailed):
    """Too many of a step's rollouts ended with an outcome whose rule is `fail`: the run stops
    (a kind of AllRolloutsFailed: the rollouts are not usable, and the command line says so)."""


@dataclass(frozen=True)
class OutcomeRule:
    action: OutcomeAction
    reward: float | None = None  # with `reward`
    max_share: float = DEFAULT_MAX_SHARE  # with `fail`


@dataclass(frozen=True)
class OutcomePolicy:
    rules: Mapping[AttemptOutcome, OutcomeRule]
    min_group: int = DEFAULT_MIN_GROUP

    def rule(self, outcome: AttemptOutcome) -> OutcomeRule:
        if outcome in INFRASTRUCTURE_OUTCOMES:
            return OutcomeRule(OutcomeAction.DROP)
        return self.rules.get(outcome, OutcomeRule(OutcomeAction.KEEP))  # ok


def default_rules(failed_rollouts: str) -> dict[AttemptOutcome, OutcomeRule]:
    """The safe defaults: an agent's own failure as `agentlightning.failed_rollouts` says (drop by
    default, `train`: keep), an over-long prompt dropped, a missing reward filled (v1.0)."""
    agent = OutcomeAction.KEEP if failed_rollouts == FailedRolloutPolicy.TRAIN else OutcomeAction.DROP
    return {
        AttemptOutcome.AGENT_ERROR: OutcomeRule(agent),
        AttemptOutcome.CONTEXT_OVERFLOW: OutcomeRule(OutcomeAction.DROP),
        AttemptOutcome.NO_REWARD: OutcomeRule(OutcomeAction.KEEP),
    }


def parse_outcome_policy(raw: Mapping[str, Any] | None, failed_rollouts: str) -> OutcomePolicy:
    """The `agentlightning.outcomes` block, checked: an unknown outcome, action or key is refused
    naming it, and so is a rule for an infrastructure outcome (never trained)."""
    rules = default_rules(failed_rollouts)
    min_group = DEFAULT_MIN_GROUP
    known = ["min_group", *(o.value for o in CONFIGURABLE)]
    for name, value in (raw or {}).items():
        key = f"{KEY}.{name}"
        if name == "min_group":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be an integer >= 1, got {value!r}")
            min_group = value
            continue
        try:
            outcome = AttemptOutcome(name)
        except ValueError:
            raise ConfigError(f"{key}: not an outcome with a policy; known: {', '.join(known)}") from None
        if outcome in INFRASTRUCTURE_OUTCOMES:
            raise ConfigError(
                f"{key}: {name} is an infrastructure failure, never trained as a reward: such rollouts "
                f"are always dropped (their groups kept while {KEY}.min_group remain); remove the key"
            )
        if outcome not in CONFIGURABLE:
            raise ConfigError(
                f"{key}: {name} rollouts are trained as they are; outcomes with a policy: {', '.join(known[1:])}"
            )
        rules[outcome] = _rule(key, value)
    return OutcomePolicy(rules, min_group)


def _rule(key: str, value: Any) -> OutcomeRule:
    if isinstance(value, str):
        value = {"action": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be an action ({', '.join(OutcomeAction)}) or a mapping with `action`")
    unknown = sorted(set(value) - set(_RULE_KEYS))
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}: not a key of an outcome's rule; keys: {', '.join(_RULE_KEYS)}"
        )
    try:
        action = OutcomeAction(str(value.get("action")))
    except ValueError:
        raise ConfigError(
            f"{key}.action: unknown action {value.get('action')!r}; one of {', '.join(OutcomeAction)}"
        ) from None
    for name, needs in _RULE_KEYS.items():
        if needs is not None and name in value and action != needs:
            raise ConfigError(
                f"{key}.{name} applies to action={needs.value} only, not {action.value}: remove it"
            )
    reward = value.get("reward")
    if action == OutcomeAction.REWARD:
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ConfigError(f"{key}.reward: action=reward needs a finite number, got {reward!r}")
        reward = float(reward)
    share = value.get("max_share", DEFAULT_MAX_SHARE)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ConfigError(f"{key}.max_share must be a number in [0, 1), got {share!r}")
    return OutcomeRule(action, reward, float(share))


def outcome_of(rollout: CollectedRollout) -> AttemptOutcome:
    """The Gateway's outcome; the trainer's own loss when stronger; derived when none was recorded."""
    recorded = rollout.outcome
    if rollout.lost and (recorded is None or recorded.rank < AttemptOutcome.LOST.rank):
        return AttemptOutcome.LOST
    if recorded is not None:
        return recorded
    if rollout.failed:
        return AttemptOutcome.AGENT_ERROR
    return AttemptOutcome.OK if last_reward(rollout.events) is not None else AttemptOutcome.NO_REWARD


@dataclass
class Selection:
    """The rollouts a step trains on, the rewards the policy sets, and the counts."""

    kept: list[CollectedRollout]
    rewards: dict[str, float] = field(default_factory=dict)  # rollout_id -> the rule's reward
    metrics: dict[str, float] = field(default_factory=dict)


def select_by_outcome(rollouts: Sequence[CollectedRollout], policy: OutcomePolicy) -> Selection:
    """Apply the policy to one step's train rollouts (in order). Raises OutcomeShareExceeded."""
    outcomes = {r.rollout_id: outcome_of(r) for r in rollouts}
    counts = Counter(outcomes.values())
    for outcome, rule in policy.rules.items():
        share = counts[outcome] / len(rollouts) if rollouts else 0.0
        if rule.action == OutcomeAction.FAIL and share > rule.max_share:
            examples = [
                r.error_message for r in rollouts if outcomes[r.rollout_id] == outcome and r.error_message
            ]
            raise OutcomeShareExceeded(
                f"{counts[outcome]} of {len(rollouts)} rollouts ended as {outcome.value}, more than "
                f"{KEY}.{outcome.value}.max_share={rule.max_share:g}: the run stops"
                + (f"; e.g. {examples[0][:240]!r}" if examples else "")
            )
    kept: list[CollectedRollout] = []
    rewards: dict[str, float] = {}
    losing: set[str] = set()  # groups that lost rollouts to the infrastructure
    for rollout in rollouts:
        outcome = outcomes[rollout.rollout_id]
        rule = policy.rule(outcome)
        if rule.action in (OutcomeAction.DROP, OutcomeAction.FAIL):
            if outcome in INFRASTRUCTURE_OUTCOMES:
                losing.add(rollout.group_id)
            continue
        if rule.action == OutcomeAction.REWARD and rule.reward is not None:
            rewards[rollout.rollout_id] = rule.reward
        kept.append(rollout)
    sizes = Counter(r.group_id for r in kept)
    thin = {g for g in losing if 0 < sizes[g] < policy.min_group}
    metrics: dict[str, float] = {f"{METRIC_PREFIX}{o.value}": float(counts[o]) for o in AttemptOutcome}
    metrics["training/n_rollouts_dropped_infrastructure"] = float(
        sum(counts[o] for o in INFRASTRUCTURE_OUTCOMES)
    )
    metrics["training/n_groups_dropped/too_few_valid"] = float(len(thin))
    metrics["training/n_rollouts_dropped_with_group"] = float(sum(sizes[g] for g in thin))
    kept = [r for r in kept if r.group_id not in thin]
    return Selection(
        kept, {rid: v for rid, v in rewards.items() if rid in {r.rollout_id for r in kept}}, metrics
    )


def valid_for_validation(
    rollouts: Sequence[CollectedRollout],
) -> tuple[list[CollectedRollout], dict[str, float]]:
    """A validation's rollouts without those the infrastructure failed (they measure the
    infrastructure, not the policy), and `val/outcome/<outcome>` counts of all of them."""
    outcomes = [outcome_of(r) for r in rollouts]
    counts = Counter(outcomes)
    metrics = {f"val/outcome/{o.value}": float(counts[o]) for o in AttemptOutcome}
    valid = [r for r, o in zip(rollouts, outcomes, strict=True) if o not in INFRASTRUCTURE_OUTCOMES]
    return valid, metrics
