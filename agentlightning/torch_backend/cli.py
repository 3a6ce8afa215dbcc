"""`agl-train`: train with the built-in torch backend from the command line.

    agl-train [backend=torch|verl] [--config FILE.yaml] [key=value ...]

`backend=verl` hands the same arguments to `agentlightning.verl.cli` (verl + vLLM on Ray).

Composes `agentlightning/config/train.yaml`, an optional file and dotted overrides, then runs
`run_ppo`. The Gateway (`agentlightning.agl_base_url`) and a controller must be running.
SIGTERM and Ctrl-C stop it cleanly: rollouts in flight are failed, the server is shut down.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agentlightning.client import GatewayUnavailable, Unauthorized
from agentlightning.config.loader import (
    catch_interrupts,
    exit_on_interrupt,
    fail,
    load_cli_config,
    setup_logging,
)

PROG = "agl-train"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    backends = [a for a in args if a.startswith("backend=")]
    args = [a for a in args if not a.startswith("backend=")]
    backend = backends[-1].partition("=")[2] if backends else "torch"
    if backend == "verl":
        from agentlightning.verl.cli import main as verl_main

        verl_main(args)
        return
    if backend != "torch":
        fail(PROG, f"backend must be torch or verl, got {backend!r}")
    cfg = load_cli_config("train", args, prog=PROG, strict=False)
    setup_logging(PROG, str(cfg.trainer.log_level), "trainer.")
    from transformers.utils import logging as hf_logging

    from agentlightning.torch_backend.distill import DistillError
    from agentlightning.torch_backend.trainer import TorchTrainer  # torch: after the cheap checks
    from agentlightning.trainer.config import ConfigError
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


if __name__ == "__main__":
    main()
