"""The backend-neutral trainer core: rollouts in, shaped and weighted training rows out.

No torch or verl here: each backend turns `TrainingRow`s (`agentlightning.rows`, built from the
recorded calls by `agentlightning.aggregation`, which the Gateway's dashboard shares) into its own
tensors.
"""

from agentlightning.config.schema import ConfigError
from agentlightning.trainer.advantage import group_advantages, rollout_advantages
from agentlightning.trainer.batch import TrainingBatch, build_training_batch
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.collector import AsyncCollector, Collector, SyncCollector, make_collector
from agentlightning.trainer.config import (
    AdvEstimator,
    AgentLightningConfig,
    CoreConfig,
    FailedRolloutPolicy,
    load_core_config,
)
from agentlightning.trainer.loop import TrainerBackend, TrainingLoop
from agentlightning.trainer.manager import Group, RolloutManager
from agentlightning.trainer.metrics import validation_metrics
from agentlightning.trainer.shaping import set_loss_weights, shape_batch, split_minibatches

__all__ = [
    "AdvEstimator",
    "AgentLightningConfig",
    "AsyncCollector",
    "CollectedRollout",
    "Collector",
    "ConfigError",
    "CoreConfig",
    "FailedRolloutPolicy",
    "Group",
    "RolloutManager",
    "SyncCollector",
    "TrainerBackend",
    "TrainingBatch",
    "TrainingLoop",
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
