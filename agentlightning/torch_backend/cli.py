"""`agl-train` (backend=torch, the default): train with the built-in torch backend.

    agl-train [backend=torch] [--config FILE.yaml] [key=value ...]

`agl-train` itself is `agentlightning.commands.backends`, which picks the backend by name and
calls `main` here with the arguments less `backend=`.

Composes `agentlightning/config/train.yaml`, an optional file and dotted overrides, then runs
`run_ppo`. The Gateway (`agentlightning.agl_base_url`) and a controller must be running.
SIGTERM and Ctrl-C stop it cleanly: rollouts in flight are failed, the server is shut down.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from agentlightning.client import GatewayUnavailable, Unauthorized
from agentlightning.config.loader import (
    USAGE,
    catch_interrupts,
    exit_on_interrupt,
    fail,
    load_cli_config,
    setup_logging,
)

PROG = "agl-train"
HELP_USAGE = "usage: agl-train [backend=torch|verl]"


def help_text() -> str:
    """The shipped `train.yaml`, then every other key the torch backend reads, with its default
    from the schema: generated, so that no key the trainer reads is missing."""
    from omegaconf import OmegaConf

    from agentlightning.config.schema import leaf_items
    from agentlightning.torch_backend.config import torch_default, torch_read_keys
    from agentlightning.trainer.config import FIXED_VERL_KEYS

    shipped = load_cli_config("train", [], prog=PROG, strict=False)
    read, maps = torch_read_keys()
    shown = {key for key, _ in leaf_items(shipped, maps=maps)}
    lines = []
    for key in sorted((read | maps) - shown):
        if key in FIXED_VERL_KEYS:  # verl's key, accepted at the values the core implements
            lines.append(
                f"  {key}: {json.dumps(FIXED_VERL_KEYS[key][-1])} (or {json.dumps(FIXED_VERL_KEYS[key][:-1])})"
            )
            continue
        lines.append(f"  {key}: {json.dumps(torch_default(key))}")
    return (
        USAGE.format(prog=PROG, defaults=OmegaConf.to_yaml(shipped)).replace(
            "usage: agl-train", HELP_USAGE, 1
        )
        + "\nThe other keys it reads, at these defaults unless set (docs/training.md#configuration):\n\n"
        + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(help_text())
        return
    cfg = load_cli_config("train", args, prog=PROG, strict=False)
    setup_logging(PROG, str(cfg.trainer.log_level), "trainer.")
    from transformers.utils import logging as hf_logging

    from agentlightning.config.schema import ConfigError
    from agentlightning.torch_backend.trainer import TorchTrainer  # torch: after the cheap checks
    from agentlightning.trainer.distill import DistillError
    from agentlightning.trainer.failures import AllRolloutsFailed

    hf_logging.disable_progress_bar()  # our own progress bar is the one to read
    catch_interrupts()
    try:
        trainer = TorchTrainer(cfg)
    except ValueError as exc:  # a ConfigError, or a data file that cannot be read
        fail(PROG, f"bad config: {exc}")
    try:
        with exit_on_interrupt(PROG):
            trainer.fit()
    except ConfigError as exc:
        fail(PROG, f"bad config: {exc}")
    except (GatewayUnavailable, Unauthorized) as exc:
        url = cfg.agentlightning.agl_base_url
        fail(PROG, f"the Gateway at {url} (agentlightning.agl_base_url): {exc}", 1)
    except AllRolloutsFailed as exc:
        fail(PROG, str(exc), 1)
    except DistillError as exc:
        fail(PROG, f"algorithm.distill: {exc}", 1)


if __name__ == "__main__":  # the torch backend alone; `agl-train` is agentlightning.commands.backends
    main()
