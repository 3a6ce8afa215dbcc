"""`agl-train backend=verl`: train with verl from the command line.

    agl-train backend=verl [--config FILE.yaml] [key=value ...]

Composes `agentlightning/verl/config.yaml` (verl's `ppo_trainer` defaults + ours), an optional
file — the same file `backend=torch` takes — and dotted overrides, then runs the loop. The
Gateway (`agentlightning.agl_base_url`) and a controller must be running. SIGTERM and Ctrl-C
stop it cleanly: rollouts in flight are failed, Ray is shut down.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentlightning.client import GatewayUnavailable, Unauthorized
from agentlightning.log import configure_logging

PROG = "agl-train backend=verl"


def _fail(message: str, code: int = 2) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(code)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str]) -> None:
    args = list(argv)
    try:
        from agentlightning.verl.version import check_verl_version

        check_verl_version()
    except ImportError as exc:
        _fail(str(exc))
    from agentlightning.trainer.config import ConfigError
    from agentlightning.verl.backend import VerlTrainer
    from agentlightning.verl.config import compose_config

    user = None
    if "--config" in args:
        i = args.index("--config")
        if i + 1 >= len(args):
            _fail("--config needs a file")
        path = Path(args[i + 1])
        del args[i : i + 2]
        if not path.is_file():
            _fail(f"config file {path} does not exist")
        user = OmegaConf.load(path)
    bad = [a for a in args if "=" not in a or a.startswith("-")]
    if bad:
        _fail(f"arguments must be key=value overrides, got {bad[0]!r}")
    try:
        cfg = compose_config(user, [f"{a}''" if a.endswith("=") else a for a in args])
        configure_logging(str(cfg.trainer.log_level))
    except (OmegaConfBaseException, ValueError) as exc:
        _fail(f"bad config: {exc}")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        trainer = VerlTrainer(cfg)
        trainer.fit()
    except KeyboardInterrupt:
        _fail("stopped", 130)
    except ConfigError as exc:
        _fail(f"bad config: {exc}")
    except (GatewayUnavailable, Unauthorized) as exc:
        _fail(f"the Gateway at {cfg.agentlightning.agl_base_url} (agentlightning.agl_base_url): {exc}", 1)
