"""`agl-server`: run the API Gateway. `agl-server port=8080 key=secret store.url=memory://`."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn
from omegaconf.errors import OmegaConfBaseException

from agentlightning.config.loader import config_error, fail, load_cli_config
from agentlightning.log import configure_logging
from agentlightning.server.app import create_app
from agentlightning.server.config import load_server_config
from agentlightning.server.http_protocol import GatewayHttpProtocol
from agentlightning.server.state import GatewayState
from agentlightning.server.store import StoreLocked

PROG = "agl-server"


class GatewayServer(uvicorn.Server):
    """uvicorn's server that ends the long-polls as soon as a shutdown begins, so that they
    answer within the grace period instead of being cancelled mid-request (which uvicorn logs
    as an error with a traceback)."""

    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.loop is not None:  # a signal handler: hand the work to the loop
            self.loop.call_soon_threadsafe(self.state.end_long_polls)


def main(argv: Sequence[str] | None = None) -> None:
    cfg = load_cli_config("server", sys.argv[1:] if argv is None else argv, prog=PROG)
    try:
        config = load_server_config(cfg)
        configure_logging(config.log_level)
        app = create_app(config)
    except (OmegaConfBaseException, ValueError) as exc:
        fail(PROG, f"bad config: {config_error(exc)}")
    server = GatewayServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=False,
            http=GatewayHttpProtocol,  # an answer's head and body in one send (http_protocol.py)
            timeout_keep_alive=75,
            backlog=4096,
            # Long-polls end at a shutdown's start; this bounds what else is still running.
            timeout_graceful_shutdown=3,
            ssl_certfile=config.tls.certfile or None,
            ssl_keyfile=config.tls.keyfile or None,
        ),
        app.state.gateway,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run
        pass
    except StoreLocked as exc:
        fail(PROG, str(exc), 1)
    if not server.started:  # as uvicorn.run: the app failed to start (uvicorn logged why)
        raise SystemExit(3)


if __name__ == "__main__":
    main()
