"""`agl-controller`: run the Rollout Controller.

agl-controller runner_type=local agl_server.url=http://127.0.0.1:8080 agl_server.key=secret
agl-controller --config my-controller.yaml local_runner.maximum_size=16
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from omegaconf.errors import OmegaConfBaseException

from agentlightning.client import AsyncGatewayClient
from agentlightning.config.loader import config_error, fail, load_cli_config
from agentlightning.controller.config import ControllerConfig, load_controller_config
from agentlightning.controller.reconciler import Reconciler
from agentlightning.controller.runner import Runner, StartupError
from agentlightning.controller.tokens import AgentKeys
from agentlightning.log import configure_logging, get_logger

log = get_logger("controller")
PROG = "agl-controller"


def make_runner(config: ControllerConfig) -> Runner:
    if config.runner_type == "k8s":
        try:
            from agentlightning.controller.k8s import K8sRunner
        except ImportError as exc:
            raise StartupError(
                f"runner_type=k8s needs the kr8s package: pip install 'agentlightning[k8s]' ({exc})"
            ) from exc
        return K8sRunner(config)
    from agentlightning.controller.local import LocalRunner

    return LocalRunner(config)


async def run_controller(config: ControllerConfig) -> None:
    """Run until SIGTERM or SIGINT."""
    runner = make_runner(config)
    # Few connections: the Gateway serves them on one event loop anyway, and httpcore's pool costs
    # CPU per request for every pooled connection.
    async with AsyncGatewayClient(
        config.agl_server.url,
        config.agl_server.key,
        timeout=config.agl_server.request_timeout,
        max_connections=8,
    ) as client:
        runner.agent_keys = AgentKeys(client, config.agl_server.key)
        reconciler = Reconciler(config, runner, client)
        if config.metrics_port >= 0:
            port = reconciler.metrics.serve(config.metrics_port, config.metrics_host)
            log.info("metrics_serving", url=f"http://{config.metrics_host}:{port}/metrics")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, reconciler.stop, sig.name)
        log.info(
            "controller_started",
            runner=config.runner_type,
            gateway=config.agl_server.url,
            capacity=runner.capacity,
            max_attempts=config.max_attempts,
        )
        try:
            await reconciler.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    log.info("controller_stopped")


def main(argv: Sequence[str] | None = None) -> None:
    cfg = load_cli_config("controller", sys.argv[1:] if argv is None else argv, prog=PROG)
    try:
        config = load_controller_config(cfg)
        configure_logging(config.log_level)
        for noisy in ("httpx", "httpcore", "kr8s"):  # one line per request even at info: too much
            logging.getLogger(noisy).setLevel(logging.WARNING)
    except (OmegaConfBaseException, ValueError) as exc:
        fail(PROG, f"bad config: {config_error(exc)}")
    if not config.agl_server.key:
        log.warning("no_gateway_key", hint="set agl_server.key when the Gateway has a key")
    try:
        asyncio.run(run_controller(config))
    except StartupError as exc:
        fail(PROG, str(exc), 1)


if __name__ == "__main__":
    main()
