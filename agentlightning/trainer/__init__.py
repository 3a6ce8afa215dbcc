"""The backend-neutral trainer core: rollouts in, shaped and weighted training rows out.

No torch or verl here: each backend turns `TrainingRow`s into its own tensors.
"""

from agentlightning.trainer.advantage import group_advantages, rollout_advantages
from agentlightning.trainer.aggregation import AggregationStats, RowLimits, aggregate_rollout
from agentlightning.trainer.batch import TrainingBatch, build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.collector import AsyncCollector, Collector, SyncCollector, make_collector
from agentlightning.trainer.config import (
    AdvEstimator,
    AgentLightningConfig,
    AggregationLevel,
    ConfigError,
    CoreConfig,
    FailedRolloutPolicy,
    load_core_config,
)
from agentlightning.trainer.loop import TrainerBackend, TrainingLoop
from agentlightning.trainer.manager import Group, RolloutManager
from agentlightning.trainer.metrics import validation_metrics
from agentlightning.trainer.rows import TrainingRow
from agentlightning.trainer.shaping import set_loss_weights, shape_batch, split_minibatches

__all__ = [
    "AdvEstimator",
    "AgentLightningConfig",
    "AggregationLevel",
    "AggregationStats",
    "AsyncCollector",
    "CollectedRollout",
    "Collector",
    "ConfigError",
    "CoreConfig",
    "FailedRolloutPolicy",
    "Group",
    "RolloutManager",
    "RowLimits",
    "SyncCollector",
    "TrainerBackend",
    "TrainingBatch",
    "TrainingLoop",
    "TrainingRow",
    "aggregate_rollout",
    "build_training_batch",
    "group_advantages",
    "load_core_config",
    "make_collector",
    "rollout_advantages",
    "set_loss_weights",
    "shape_batch",
    "split_minibatches",
    "validation_metrics",
]
