"""The verl backend: the trainer core's loop on verl's FSDP workers and vLLM replicas, over Ray.

    from agentlightning.verl import run_ppo
    run_ppo(config, train_dataset, val_dataset)      # as v1.0, and as the torch backend

Importing this package checks that the installed verl is the supported release
(`version.SUPPORTED_VERL_VERSION`) and fails naming it otherwise. docs/verl_backend.md.
"""

from agentlightning.verl.version import SUPPORTED_VERL_VERSION, VerlVersionError, check_verl_version

check_verl_version()

from agentlightning.verl.backend import VerlBackend, VerlTrainer, run_ppo  # noqa: E402

__all__ = [
    "SUPPORTED_VERL_VERSION",
    "VerlBackend",
    "VerlTrainer",
    "VerlVersionError",
    "check_verl_version",
    "run_ppo",
]
