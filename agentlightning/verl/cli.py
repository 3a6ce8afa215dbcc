"""`agl-train backend=verl`: train with verl from the command line.

    agl-train backend=verl [--config FILE.yaml] [key=value ...]

Composes `agentlightning/verl/config.yaml` (verl's `ppo_trainer` defaults + ours), an optional
file — the same file `backend=torch` takes — and dotted overrides, then runs the loop. The
Gateway (`agentlightning.agl_base_url`) and a controller must be running. SIGTERM and Ctrl-C
stop it cleanly: rollouts in flight are failed, Ray is shut down.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentlightning.client import GatewayUnavailable, Unauthorized
from agentlightning.config.loader import catch_interrupts, config_args, exit_on_interrupt, fail, setup_logging
from agentlightning.trainer.failures import AllRolloutsFailed

PROG = "agl-train backend=verl"


def main(argv: Sequence[str]) -> None:
    try:
        from agentlightning.verl.version import check_verl_version

        check_verl_version()
    except ImportError as exc:
        fail(PROG, str(exc))
    from agentlightning.config.schema import ConfigError
    from agentlightning.trainer.distill import DistillError
    from agentlightning.verl.backend import VerlTrainer
    from agentlightning.verl.config import compose_config

    user_file, overrides = config_args(argv, PROG)
    try:
        user = OmegaConf.load(user_file) if user_file is not None else None
        if isinstance(user, ListConfig):
            fail(PROG, f"bad config: {user_file} holds a list, not a mapping of settings")
        cfg = compose_config(user, overrides)
    except (OmegaConfBaseException, ValueError) as exc:
        fail(PROG, f"bad config: {exc}")
    setup_logging(PROG, str(cfg.trainer.log_level), "trainer.")
    catch_interrupts()
    try:
        with exit_on_interrupt(PROG):
            VerlTrainer(cfg).fit()
    except ConfigError as exc:
        fail(PROG, f"bad config: {exc}")
    except (GatewayUnavailable, Unauthorized) as exc:
        fail(
            PROG, f"the Gateway at {cfg.agentlightning.agl_base_url} (agentlightning.agl_base_url): {exc}", 1
        )
    except AllRolloutsFailed as exc:
        fail(PROG, str(exc), 1)
    except DistillError as exc:
        fail(PROG, f"algorithm.distill: {exc}", 1)
