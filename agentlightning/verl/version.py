"""The verl release this backend is written against, checked when `agentlightning.verl` is imported.

verl moves its internals between minor releases (0.8 → 0.9 moved `TaskRunner`, the workers and
`create_rl_sampler`), so another version fails here, naming the supported one, instead of
deep inside Ray workers.
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_VERL_VERSION = "0.9.1"
INSTALL_HINT = (
    f"install it with `scripts/setup_verl.sh {SUPPORTED_VERL_VERSION} cu128` on a GPU machine "
    f"(or `make .venv-verl/.installed` for the CPU test venv)"
)


class VerlVersionError(ImportError):
    """verl is missing or is not the supported release."""


def installed_verl_version() -> str | None:
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def check_verl_version(installed: str | None = None) -> str:
    """The installed verl version; raises VerlVersionError unless it is the supported one."""
    version = installed if installed is not None else installed_verl_version()
    if not version:
        raise VerlVersionError(
            f"the verl backend needs verl {SUPPORTED_VERL_VERSION}, which is not installed: {INSTALL_HINT}"
        )
    if version != SUPPORTED_VERL_VERSION:
        raise VerlVersionError(
            f"the verl backend supports verl {SUPPORTED_VERL_VERSION} only, found verl {version}: "
            f"{INSTALL_HINT}"
        )
    return version
