"""The verl backend: the trainer core's loop on verl's FSDP workers and vLLM replicas, over Ray.

Importing this package checks that the installed verl is the supported release
(`version.SUPPORTED_VERL_VERSION`) and fails naming it otherwise.
"""

from agentlightning.verl.version import SUPPORTED_VERL_VERSION, VerlVersionError, check_verl_version

check_verl_version()

__all__ = ["SUPPORTED_VERL_VERSION", "VerlVersionError", "check_verl_version"]
