"""`agl-train`: train with the built-in torch backend from the command line.

    agl-train [backend=torch|verl] [--config FILE.yaml] [key=value ...]

`backend=verl` hands the same arguments to `agentlightning.verl.cli` (verl + vLLM on Ray).

Composes `agentlightning/config/train.yaml`, an optional file and dotted overrides, then runs
`run_ppo`. The Gateway (`agentlightning.agl_base_url`) and a controller must be running.
SIGTERM and Ctrl-C stop it cleanly: rollouts in flight are failed, the server is shut down.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from types import FrameType

from agentlightning.client import GatewayUnavailable, Unauthorized
from agentlightning.config.loader import load_cli_config
from agentlightning.log import configure_logging


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


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
        print(f"agl-train: backend must be torch or verl, got {backend!r}", file=sys.stderr)
        raise SystemExit(2)
    cfg = load_cli_config("train", args, prog="agl-train", strict=False)
    try:
        configure_logging(str(cfg.trainer.log_level))
    except ValueError as exc:
        print(f"agl-train: trainer.{exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from transformers.utils import logging as hf_logging

    from agentlightning.torch_backend.trainer import TorchTrainer  # torch: after the cheap checks
    from agentlightning.trainer.config import ConfigError

    hf_logging.disable_progress_bar()  # our own progress bar is the one to read
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        trainer = TorchTrainer(cfg)
    except (ConfigError, ValueError) as exc:
        print(f"agl-train: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        trainer.fit()
    except KeyboardInterrupt:
        print("agl-train: stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except ConfigError as exc:
        print(f"agl-train: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (GatewayUnavailable, Unauthorized) as exc:
        url = cfg.agentlightning.agl_base_url
        print(f"agl-train: the Gateway at {url} (agentlightning.agl_base_url): {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
